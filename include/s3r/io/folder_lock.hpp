#pragma once
// An exclusive lock on a folder for the life of an object: flock(2) on FOLDER/.lock, released by
// the destructor or when the process dies (kill -9 included), so a stale lock never blocks.
#include <string>

namespace s3r::io {

class FolderLock {
 public:
  // Creates FOLDER/.lock if needed and takes the lock without waiting. Throws s3r::Error naming
  // the folder (and the pid that holds it, as written into the lock file) when another process
  // holds it, or when the lock file cannot be created.
  explicit FolderLock(const std::string& folder);
  ~FolderLock();
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace s3r::io
