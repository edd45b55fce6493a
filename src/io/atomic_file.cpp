#include "s3r/io/atomic_file.hpp"

#include <filesystem>
#include <fstream>

#include "s3r/core/error.hpp"

namespace s3r::io {

void write_file_atomic(const std::string& path, const std::function<void(std::ostream&)>& write) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error("cannot open '" + tmp + "' for writing");
    write(out);
    out.flush();
    if (!out) throw Error("writing '" + tmp + "' failed (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error("cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
}

}  // namespace s3r::io
