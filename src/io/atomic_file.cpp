#include "s3r/io/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "s3r/core/error.hpp"

namespace s3r::io {

void sync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error("cannot open '" + path + "' to sync it: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // EINVAL: a file system that cannot sync folders; nothing more can be done there.
  if (rc != 0 && err != EINVAL) throw Error("cannot sync '" + path + "' to disk: " + std::strerror(err));
}

void sync_parent(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  sync_path(parent.empty() ? "." : parent.string());
}

void write_file_atomic(const std::string& path, const std::function<void(std::ostream&)>& write) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error("cannot open '" + tmp + "' for writing");
    write(out);
    out.flush();
    if (!out) throw Error("writing '" + tmp + "' failed (disk full?)");
    out.close();
    if (!out) throw Error("closing '" + tmp + "' failed (disk full?)");
  }
  sync_path(tmp);  // the data on disk before the name points at it
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error("cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
  sync_parent(path);  // the rename itself on disk
}

}  // namespace s3r::io
