#pragma once
// Durable file writes. write_file_atomic: the content goes to PATH.tmp, is flushed and fsynced,
// and is renamed over PATH, and PATH's folder is fsynced, so that after it returns the new
// content survives a crash or power loss, and a crash at any moment leaves under PATH either
// the old content or the new, never half a file.
#include <functional>
#include <ostream>
#include <string>

namespace s3r::io {

// Calls `write` with a binary stream on PATH.tmp, then renames it to PATH. Throws s3r::Error
// naming the file when it cannot be opened, written (disk full), synced or renamed.
void write_file_atomic(const std::string& path, const std::function<void(std::ostream&)>& write);

// fsync(2) of a file or a folder (a folder: so that renames and new entries in it are on disk).
// Throws s3r::Error naming the path.
void sync_path(const std::string& path);

// sync_path of the folder that holds `path` ("." for a bare file name).
void sync_parent(const std::string& path);

}  // namespace s3r::io
