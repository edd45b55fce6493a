#include "s3r/gemm/machine_line.hpp"

#include <omp.h>

#include <sstream>

#include "s3r/core/cpu_features.hpp"
#include "s3r/core/isa.hpp"
#include "s3r/core/machine.hpp"
#include "s3r/gemm/backend.hpp"
#include "s3r/gemm/matmul.hpp"

namespace s3r {

std::string machine_line() {
  std::ostringstream s;
  s << cpu_model_name() << ", " << omp_get_num_procs() << " logical cores ("
    << describe(cpu_features()) << "); kernels " << isa_name(active_isa()) << "; "
    << gemm::backends_line() << "; " << omp_get_max_threads() << " OpenMP threads, oneDNN "
    << gemm::onednn_version();
  return s.str();
}

}  // namespace s3r
