#pragma once
// Atomic file writes: the content goes to PATH.tmp, is flushed, and is renamed over PATH, so a
// crash or kill never leaves half a file under PATH.
#include <functional>
#include <ostream>
#include <string>

namespace s3r::io {

// Calls `write` with a binary stream on PATH.tmp, then renames it to PATH. Throws s3r::Error
// naming the file when it cannot be opened, written (disk full) or renamed.
void write_file_atomic(const std::string& path, const std::function<void(std::ostream&)>& write);

}  // namespace s3r::io
