#pragma once
// Text input of `s3r data prepare` and `s3r eval --text`: files and folders -> documents.
//
// Inputs (files or folders, read recursively in name order):
//   - plain text: .txt, .text, .md; one document per blank-line-separated paragraph;
//   - JSON: .jsonl/.json with a "text" field per line (the C4 format), or a .json(l) file
//     holding one array of strings;
//   - each of these gzip-compressed (NAME.EXT.gz).
// In a folder, files of any other extension, hidden files and folders (".name"), symbolic links to
// folders, non-regular files, and the folders `is_output_folder` names are skipped with a warning
// (never read). A file named explicitly is read as plain text whatever its extension (NAME.gz:
// decompressed, then as plain text). Every file read must be valid UTF-8 without NUL bytes (a UTF-8
// byte-order mark is dropped), else it is an error naming the file and the byte offset: a binary
// file under a text name is never tokenized as text. A truncated or corrupt .gz, or a .gz that is
// not gzip at all, is an error naming the file.
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace s3r::data {

// Reads every document of the inputs, in input order; throws s3r::Error naming the file (and line)
// at fault, or when the inputs hold no document, prefixed with `command` (the tool that reads:
// "data prepare: ...", "eval: ..."). Files skipped in folders are appended to `warnings` when it
// is given. A folder met inside an input folder for which `is_output_folder` (when given) returns
// true is skipped as the output folder or one of its temporary folders.
std::vector<std::string> read_documents(
    const std::vector<std::string>& inputs, std::vector<std::string>* warnings = nullptr,
    const std::function<bool(const std::filesystem::path&)>& is_output_folder = nullptr,
    const std::string& command = "data prepare");

}  // namespace s3r::data
