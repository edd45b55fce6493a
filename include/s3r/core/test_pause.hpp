#pragma once
// Test-only pause points, so that a crash test can kill a process at a named moment (inside a
// training step, a checkpoint write, an evaluation, a dataset swap) and prove that it did.
//
// S3R_TEST_PAUSE_AT=POINT[:N] arms one point: the Nth time (default 1) this process reaches
// test_pause(POINT), it flushes stdio, writes "PID POINT N" to the file S3R_TEST_PAUSE_FILE
// (written beside and renamed, so a reader never sees half of it), and blocks until a signal
// ends it. Unset (production), a call is one check of a cached pointer. Under MPI each rank that
// reaches the point pauses, and the last one's line is in the file. The points, where they are:
//   train-step              trainer.cpp: after the forward and backward, before the update
//   eval-batch              trainer.cpp: after each validation batch
//   checkpoint-write        ckpt/checkpoint.cpp: checkpoint.tmp/ holds the weights only
//   checkpoint-before-swap  ckpt/checkpoint.cpp: checkpoint.tmp/ complete, nothing renamed yet
//   checkpoint-swap-renames checkpoint_folder.cpp: checkpoint/ moved to checkpoint.old/, the new not in
//   checkpoint-swapped      checkpoint_folder.cpp: the new checkpoint/ in place, checkpoint.old/ not removed
//   prepare-write           prepare.cpp: OUT.tmp-<pid>/ holds the shards, not info.json
//   prepare-before-swap     prepare.cpp: OUT.tmp-<pid>/ complete and verified, OUT untouched
//   prepare-swap-renames    dataset_folder.cpp: OUT moved to OUT.old-<pid>, the new one not in
//                           (arming it makes the swap take the two-rename path on any file system)
//   prepare-swapped         dataset_folder.cpp: the new OUT in place, the old one not yet removed
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace s3r {

namespace detail {

inline constexpr const char* kTestPausePoints[] = {
    "train-step",         "eval-batch",    "checkpoint-write",    "checkpoint-before-swap", "checkpoint-swap-renames",
    "checkpoint-swapped", "prepare-write", "prepare-before-swap", "prepare-swap-renames",   "prepare-swapped"};

struct TestPauseArm {
  std::string point;
  long occurrence = 1;
  std::string marker;  // S3R_TEST_PAUSE_FILE; empty: only the line on stderr
  std::atomic<long> hits{0};
};

// The armed point, read once; nullptr when S3R_TEST_PAUSE_AT is unset or malformed (a warning).
inline TestPauseArm* test_pause_arm() {
  static TestPauseArm* const arm = []() -> TestPauseArm* {
    const char* at = std::getenv("S3R_TEST_PAUSE_AT");
    if (at == nullptr || *at == '\0') return nullptr;
    auto* a = new TestPauseArm;  // lives as long as the process
    const char* colon = std::strchr(at, ':');
    a->point.assign(at, colon ? static_cast<size_t>(colon - at) : std::strlen(at));
    char* end = nullptr;
    if (colon) a->occurrence = std::strtol(colon + 1, &end, 10);
    bool known = false;
    for (const char* p : kTestPausePoints) known = known || a->point == p;
    if (!known || (colon && (end == colon + 1 || *end != '\0' || a->occurrence < 1))) {
      std::fprintf(stderr, "s3r: warning: S3R_TEST_PAUSE_AT='%s' is not POINT or POINT:N (N >= 1) of a known point; "
                   "ignored\n", at);
      delete a;
      return nullptr;
    }
    if (const char* f = std::getenv("S3R_TEST_PAUSE_FILE")) a->marker = f;
    return a;
  }();
  return arm;
}

// Reached the armed point for the Nth time: report it, then wait to be killed.
[[noreturn]] inline void test_pause_here(const TestPauseArm& a, long n) {
  std::fflush(nullptr);  // what the process logged so far is in its files
  const std::string line = std::to_string(::getpid()) + " " + a.point + " " + std::to_string(n) + "\n";
  std::fprintf(stderr, "s3r: test pause at %s (%ld), pid %d\n", a.point.c_str(), n, static_cast<int>(::getpid()));
  if (!a.marker.empty()) {
    const std::string tmp = a.marker + ".tmp-" + std::to_string(::getpid());
    if (std::FILE* f = std::fopen(tmp.c_str(), "w")) {
      std::fputs(line.c_str(), f);
      std::fclose(f);
      std::rename(tmp.c_str(), a.marker.c_str());
    }
  }
  for (;;) ::pause();
}

}  // namespace detail

// Whether S3R_TEST_PAUSE_AT names `point` (at any occurrence).
inline bool test_pause_armed(const char* point) {
  const detail::TestPauseArm* a = detail::test_pause_arm();
  return a != nullptr && a->point == point;
}

// A named pause point (see above); returns at once unless the test armed this point.
inline void test_pause(const char* point) {
  detail::TestPauseArm* a = detail::test_pause_arm();
  if (a == nullptr || a->point != point) return;
  const long n = ++a->hits;
  if (n == a->occurrence) detail::test_pause_here(*a, n);
}

}  // namespace s3r
