#pragma once
// The all-or-nothing dataset folder of `s3r data prepare` (internal; the contract the user sees is
// in s3r/data/prepare.hpp, "Output, all or nothing").
//
// Order of use: dataset_path (OUT, resolved), clean_leftovers, check_replaceable, then
// TempDatasetFolder (OUT.tmp-<pid>) receives every file, verify_and_sync checks and fsyncs it,
// check_replaceable again, and swap_in puts it in place of OUT. Only swap_in replaces OUT (and
// clean_leftovers restores a missing OUT from OUT.old-<pid>); nothing is ever deleted that prepare
// did not write. Errors are s3r::Error naming the folder; std::filesystem errors pass through
// (prepare converts them).
#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace s3r::data {

using Progress = std::function<void(const std::string&)>;

// `given` (--out) made absolute with its symbolic links resolved; throws for a file system root.
std::filesystem::path dataset_path(const std::string& given);

// Whether `p` is `out` or one of its temporary siblings (OUT.tmp-<pid>, OUT.old-<pid>); false when
// `p` cannot be resolved. For read_documents' `is_output_folder`.
bool is_dataset_or_temporary(const std::filesystem::path& out, const std::filesystem::path& p);

// Cleans what a killed prepare into `out` left beside it: OUT.old-<pid> (the old dataset, moved
// aside by the two-rename swap) goes back to OUT when OUT is missing; other OUT.old-<pid> and
// OUT.tmp-<pid> folders of processes that are gone are removed. Each action is reported to `say`.
void clean_leftovers(const std::filesystem::path& out, const Progress& say);

// Throws unless `out` is missing, an empty folder, or a folder of dataset files only (those prepare
// writes, tokenizer_corpus.txt and *.tmp files). `given` is --out as the user wrote it.
void check_replaceable(const std::filesystem::path& out, const std::string& given);

// The temporary sibling OUT.tmp-<pid> of `out`: created empty (with OUT's parent folders), and
// removed with everything in it on destruction (after swap_in: the old dataset, if any).
class TempDatasetFolder {
 public:
  explicit TempDatasetFolder(const std::filesystem::path& out);
  ~TempDatasetFolder();
  TempDatasetFolder(const TempDatasetFolder&) = delete;
  TempDatasetFolder& operator=(const TempDatasetFolder&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// FNV-1a over the token values: what a shard must read back as.
uint64_t token_digest(const std::vector<uint32_t>& tokens);

// What was written into the temporary folder.
struct WrittenDataset {
  uint32_t vocab = 0;
  int64_t train_tokens = 0, val_tokens = 0;
  uint64_t train_digest = 0, val_digest = 0;  // token_digest of each shard
  nlohmann::json info;                        // the content of info.json
};

// Re-reads train.bin, val.bin and info.json in `dir` and throws (disk or file system fault) unless
// they match `written`; then fsyncs the dataset files present and `dir` itself.
void verify_and_sync(const std::filesystem::path& dir, const WrittenDataset& written);

// Puts `tmp` in place of `out` (one atomic exchange where the file system has it, else two renames)
// and fsyncs the parent; on return the old content of `out` (if any) is in `tmp` or gone.
void swap_in(const std::filesystem::path& tmp, const std::filesystem::path& out, const Progress& say);

}  // namespace s3r::data
