// libFuzzer target: bytes -> a text input file -> data::read_documents
// (include/s3r/data/prepare.hpp). The first byte picks the file name, so one corpus covers every
// reader: 0 plain text (.txt), 1 JSON lines (.jsonl), 2 a JSON array of strings (.json), 3 gzip
// JSON lines (.json.gz; the C4 format); the rest of the input is the file.
#include <cstdint>

#include "fuzz_util.hpp"
#include "s3r/core/error.hpp"
#include "s3r/data/prepare.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const char* const kNames[] = {"input.txt", "input.jsonl", "input.json", "input.json.gz"};
  const auto path = s3r::fuzz::scratch() / kNames[data[0] % 4];
  s3r::fuzz::write_file(path, s3r::fuzz::as_view(data + 1, size - 1));
  try {
    (void)s3r::data::read_documents({path.string()});
  } catch (const s3r::Error&) {
  }
  std::error_code ec;
  std::filesystem::remove(path, ec);
  return 0;
}
