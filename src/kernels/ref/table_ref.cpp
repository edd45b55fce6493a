// The ref tier's kernel table (kernels/kernels.hpp).
#include "kernels/kernels.hpp"

namespace s3r::kernels::ref {

const KernelTable& table() {
  static constexpr KernelTable kTable = S3R_KERNEL_TABLE;
  return kTable;
}

}  // namespace s3r::kernels::ref
