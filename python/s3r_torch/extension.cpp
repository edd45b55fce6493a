// s3r_torch._C: s3r's QuantLinear (s3r/nn/quant_linear.hpp) over PyTorch tensors. The Python
// package (__init__.py) holds the module, the autograd function and the key rule; this file
// checks every tensor it is given (so that no call from Python can crash the interpreter),
// converts between nn.Linear's weight layout (out, in) and s3r's W (in, out) (s3r's transpose
// kernel: torch's strided copy took 12 ms for a 4096 x 1024 matrix, a third of the layer's
// forward), and runs s3r's layer with the GIL released and PyTorch's intra-op thread count.
//
// Shapes: x (T, K) f32, weight (N, K) f32 as nn.Linear stores it (s3r's W = weight^T), y and
// g (T, N), dx (T, K), dweight (N, K). T is a multiple of S, the tokens of one example.
#include <omp.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "s3r/core/error.hpp"
#include "s3r/gemm/machine_line.hpp"
#include "s3r/model/layers.hpp"
#include "s3r/nn/quant_linear.hpp"
#include "s3r/nn/recipe.hpp"
#include "s3r/quant/grad_quant.hpp"
#include "s3r/rng/threefry.hpp"

namespace py = pybind11;

namespace {

using s3r::nn::LinearMode;
using s3r::nn::Recipe;

// The checks of every tensor argument, in the words of the module's user.
void check_tensor(const torch::Tensor& t, const char* what, int64_t dims) {
  if (!t.defined()) throw py::value_error(std::string("s3r_torch: ") + what + " is undefined");
  if (t.device().type() != torch::kCPU) {
    throw py::value_error(std::string("s3r_torch: ") + what + " is on " + t.device().str() +
                          "; s3r runs on the CPU only (move the model and its inputs with .cpu())");
  }
  if (t.scalar_type() != torch::kFloat32) {
    throw py::type_error(std::string("s3r_torch: ") + what + " has dtype " +
                         std::string(c10::toString(t.scalar_type())) + ", expected torch.float32");
  }
  if (t.dim() != dims) {
    throw py::value_error(std::string("s3r_torch: ") + what + " has " + std::to_string(t.dim()) +
                          " dimensions, expected " + std::to_string(dims));
  }
  if (!t.is_contiguous()) {
    throw py::value_error(std::string("s3r_torch: ") + what + " is not contiguous (call .contiguous() on it)");
  }
}

// A recipe for one linear layer: a named recipe without an LM-head choice.
Recipe layer_recipe(const std::string& name) {
  Recipe r;
  try {
    r = Recipe::parse(name);
  } catch (const s3r::Error& e) {
    throw py::value_error(std::string("s3r_torch: unknown recipe '") + name + "' (" + e.what() +
                          "); s3r_torch.recipes() lists them");
  }
  if (r.head_choice() == s3r::nn::HeadChoice::kInt8) {
    throw py::value_error("s3r_torch: recipe '" + name + "' names an LM-head choice, which has no meaning for one layer; "
                          "use '" + r.with_head(s3r::nn::HeadChoice::kDefault).name() +
                          "' (convert(..., skip=[]) converts a head too)");
  }
  return r;
}

// The layers' outputs (y, dx, dweight) of 1 MiB or more, in buffers from a pool of freed ones.
// torch::empty of 32 MB is a fresh mmap whose 8192 pages the kernel zeroes on first touch: a fifth
// of a 2048 x 1024 -> 4096 layer's forward on the Emerald Rapids VM. A freed buffer waits for the
// next request of its size (64-byte aligned, the rows the GEMMs' epilogues write), up to kMaxHeld
// bytes in all; release() frees the waiting ones (s3r_torch.release_buffers()). Leaked on purpose:
// tensors may outlive the module at the interpreter's exit.
class OutputPool {
 public:
  static constexpr size_t kMinBytes = size_t{1} << 20;
  static constexpr size_t kMaxHeld = size_t{2} << 30;

  static OutputPool& instance() {
    static OutputPool* pool = new OutputPool;
    return *pool;
  }

  torch::Tensor empty(at::IntArrayRef sizes) {
    int64_t numel = 1;
    for (const int64_t s : sizes) numel *= s;
    const size_t bytes = (static_cast<size_t>(numel) * sizeof(float) + 63) / 64 * 64;
    const auto options = torch::TensorOptions().dtype(torch::kFloat32);
    if (bytes < kMinBytes) return torch::empty(sizes, options);
    void* data = take(bytes);
    if (data == nullptr) data = std::aligned_alloc(64, bytes);
    if (data == nullptr) throw std::bad_alloc();
    return torch::from_blob(data, sizes, [bytes](void* p) { instance().give_back(p, bytes); }, options);
  }

  void release() {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [bytes, list] : free_) {
      for (void* p : list) std::free(p);
    }
    free_.clear();
    held_ = 0;
  }

  size_t held() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return held_;
  }

 private:
  void* take(size_t bytes) {
    const std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.find(bytes);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    held_ -= bytes;
    return p;
  }

  void give_back(void* p, size_t bytes) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      if (held_ + bytes <= kMaxHeld) {
        free_[bytes].push_back(p);
        held_ += bytes;
        return;
      }
    }
    std::free(p);
  }

  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t held_ = 0;
};

torch::Tensor empty_output(at::IntArrayRef sizes) { return OutputPool::instance().empty(sizes); }

// What the backward pass needs of one forward call: the quantized (or converted) X and W.
struct Saved {
  Recipe recipe;
  s3r::nn::LinearInput x;
  s3r::nn::LinearWeight w;
  int64_t tokens_per_example = 0;
};

// Saved objects whose backward pass is done, kept with their buffers for the next forward calls:
// a fresh one's codes (megabytes) were zero-filled and page-faulted on every call. At most
// kMaxKept wait; a forward call takes the one used last (the layers of a model run in the same
// order every step, so its buffers mostly have the right sizes already).
class SavedPool {
 public:
  static constexpr size_t kMaxKept = 64;

  static SavedPool& instance() {
    static SavedPool* pool = new SavedPool;
    return *pool;
  }

  // The last kept one of this recipe (a bf16 layer's would hold stale bf16 values), or a new one.
  std::unique_ptr<Saved> take(const Recipe& recipe) {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = kept_.rbegin(); it != kept_.rend(); ++it) {
      if (!((*it)->recipe == recipe)) continue;
      std::unique_ptr<Saved> s = std::move(*it);
      kept_.erase(std::next(it).base());
      return s;
    }
    return std::make_unique<Saved>();
  }

  // Keeps the buffers of `saved`, whose backward pass is done (it is left empty).
  void give_back(Saved& saved) {
    auto s = std::make_unique<Saved>(std::move(saved));
    saved = Saved{};  // no codes, no tokens: backward() refuses it
    const std::lock_guard<std::mutex> lock(mutex_);
    if (kept_.size() < kMaxKept) kept_.push_back(std::move(s));
  }

  void release() {
    const std::lock_guard<std::mutex> lock(mutex_);
    kept_.clear();
  }

 private:
  std::mutex mutex_;
  std::vector<std::unique_ptr<Saved>> kept_;
};

// The backward pass's scratch, shared by every layer (as s3r's model shares one across its
// projections: the buffers take the largest layer's size once); the mutex serializes backward
// passes run from several Python threads.
struct Workspace {
  std::mutex busy;
  s3r::nn::LinearWorkspace ws;
};

std::span<const float> cspan(const torch::Tensor& t) {
  return {t.data_ptr<float>(), static_cast<size_t>(t.numel())};
}
std::span<float> span(torch::Tensor& t) { return {t.data_ptr<float>(), static_cast<size_t>(t.numel())}; }

// SPEC section 3: fold_in(fold_in(key(seed), step), layer_index).
s3r::Key layer_key_of(uint32_t seed, uint32_t step, uint32_t layer_index) {
  return s3r::fold_in(s3r::fold_in(s3r::key_from_seed(seed), step), layer_index);
}

void use_torch_threads() { omp_set_num_threads(std::max(1, at::get_num_threads())); }

// y = x weight^T in the recipe's forward; also returns what the backward pass needs when wanted.
py::tuple forward(const torch::Tensor& x, const torch::Tensor& weight, const std::string& recipe_name,
                  int64_t tokens_per_example, bool keep) {
  const Recipe recipe = layer_recipe(recipe_name);
  check_tensor(x, "input", 2);
  check_tensor(weight, "weight", 2);
  const int64_t T = x.size(0), K = x.size(1), N = weight.size(0);
  if (weight.size(1) != K) {
    throw py::value_error("s3r_torch: the input has " + std::to_string(K) + " features, the weight (" +
                          std::to_string(N) + ", " + std::to_string(weight.size(1)) + ") expects " +
                          std::to_string(weight.size(1)));
  }
  if (T < 1 || K < 1 || N < 1) throw py::value_error("s3r_torch: empty input or weight");
  if (tokens_per_example < 1 || T % tokens_per_example != 0) {
    throw py::value_error("s3r_torch: " + std::to_string(T) + " tokens are not whole examples of " +
                          std::to_string(tokens_per_example));
  }
  std::unique_ptr<Saved> saved = SavedPool::instance().take(recipe);
  saved->recipe = recipe;
  saved->tokens_per_example = tokens_per_example;
  torch::Tensor y = empty_output({T, N});
  {
    py::gil_scoped_release nogil;
    use_torch_threads();
    const LinearMode mode = recipe.projections();
    s3r::nn::prepare_input(saved->x, cspan(x), T, K, mode, "input");
    if (s3r::nn::is_int8(mode)) {  // quantized from (N, K) as it is, the codes transposed
      s3r::nn::prepare_weight_transposed(saved->w, cspan(weight), K, N, mode, "weight");
    } else {
      torch::Tensor w_kn = torch::empty({K, N}, weight.options());  // s3r's W (K, N)
      s3r::model::transpose_into(w_kn.data_ptr<float>(), weight.data_ptr<float>(), N, K);
      s3r::nn::prepare_weight(saved->w, cspan(w_kn), K, N, mode, "weight");
    }
    s3r::nn::linear_forward(span(y), saved->x, saved->w);
  }
  if (!keep) return py::make_tuple(y, py::none());
  return py::make_tuple(y, py::cast(saved.release(), py::return_value_policy::take_ownership));
}

// (dx or None, dweight) of one forward call, with the threshold key of SPEC section 3:
// fold_in(fold_in(key(seed), step), layer_index); token 0 of g has the global index first_token.
py::tuple backward(Saved& saved, const torch::Tensor& g, bool want_dx, uint32_t seed, uint32_t step,
                   uint32_t layer_index, uint64_t first_token, Workspace& workspace) {
  check_tensor(g, "grad_output", 2);
  if (saved.x.tokens == 0) {
    throw py::value_error("s3r_torch: this forward call's codes were used by a backward pass already");
  }
  const int64_t T = saved.x.tokens, K = saved.x.features, N = saved.w.out;
  if (g.size(0) != T || g.size(1) != N) {
    throw py::value_error("s3r_torch: grad_output is (" + std::to_string(g.size(0)) + ", " +
                          std::to_string(g.size(1)) + "), the forward's output was (" + std::to_string(T) + ", " +
                          std::to_string(N) + ")");
  }
  torch::Tensor dx = want_dx ? empty_output({T, K}) : torch::Tensor();
  torch::Tensor dweight = empty_output({N, K});
  {
    py::gil_scoped_release nogil;
    const std::lock_guard<std::mutex> lock(workspace.busy);
    use_torch_threads();
    s3r::nn::LinearBackwardConfig config;
    config.correction = saved.recipe.correction();
    config.tokens_per_example = saved.tokens_per_example;
    config.layer_key = layer_key_of(seed, step, layer_index);
    config.placement.first_token = first_token;
    // dweight (N, K) straight from the product where it can be; else s3r's dW (K, N) transposed.
    config.dw_transposed = s3r::nn::dw_transposable(saved.x.mode, config);
    torch::Tensor dw_kn = config.dw_transposed ? dweight : empty_output({K, N});
    std::span<float> dx_span = want_dx ? span(dx) : std::span<float>();
    s3r::nn::linear_backward(dx_span, span(dw_kn), cspan(g), saved.x, saved.w, config, workspace.ws);
    if (!config.dw_transposed) {
      s3r::model::transpose_into(dweight.data_ptr<float>(), dw_kn.data_ptr<float>(), K, N);
    }
  }
  SavedPool::instance().give_back(saved);  // the codes are not read again
  return py::make_tuple(want_dx ? py::cast(dx) : py::none(), dweight);
}

py::list recipes() {
  py::list out;
  for (const s3r::nn::NamedRecipe& r : s3r::nn::named_recipes()) {
    out.append(py::make_tuple(r.recipe.name(), std::string(r.about)));
  }
  return out;
}

std::string canonical_recipe(const std::string& name) { return layer_recipe(name).name(); }

py::tuple layer_key(uint32_t seed, uint32_t step, uint32_t layer_index) {
  const s3r::Key k = layer_key_of(seed, step, layer_index);
  return py::make_tuple(k.k0, k.k1);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "s3r's int8 linear layer (S3R, S3R-EC) over PyTorch tensors; use the s3r_torch package";
  // A NaN or Inf in X, W or G: FloatingPointError; any other error of the library: RuntimeError.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const s3r::NonFiniteError& e) {
      PyErr_SetString(PyExc_FloatingPointError, (std::string("s3r_torch: ") + e.what()).c_str());
    } catch (const s3r::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, (std::string("s3r_torch: ") + e.what()).c_str());
    }
  });
  py::class_<Saved>(m, "Saved", "what one forward call keeps for its backward (int8 codes and scales)")
      .def_property_readonly("recipe", [](const Saved& s) { return s.recipe.name(); })
      .def_property_readonly("bytes", [](const Saved& s) {
        return s.x.codes.size() + 4 * (s.x.scales.size() + s.x.f32_values.size() + s.w.scales.size() +
                                       s.w.f32_values.size() + s.w.code_row_sums.size()) +
               2 * (s.x.bf16_values.size() + s.w.bf16_values.size()) + s.w.codes.size();
      });
  py::class_<Workspace>(m, "Workspace", "one layer's scratch for its backward pass").def(py::init<>());
  m.def("forward", &forward, py::arg("x"), py::arg("weight"), py::arg("recipe"), py::arg("tokens_per_example"),
        py::arg("keep"));
  m.def("backward", &backward, py::arg("saved"), py::arg("grad_output"), py::arg("want_dx"), py::arg("seed"),
        py::arg("step"), py::arg("layer_index"), py::arg("first_token"), py::arg("workspace"));
  m.def("release_buffers", [] {
    OutputPool::instance().release();
    SavedPool::instance().release();
  }, "frees the output buffers and saved codes that wait for reuse");
  m.def("pooled_bytes", [] { return OutputPool::instance().held(); },
        "bytes of output buffers waiting for reuse");
  m.def("recipes", &recipes, "[(name, about)] of s3r's named recipes");
  m.def("machine", [] { use_torch_threads(); return s3r::machine_line(); },
        "s3r's machine line: CPU, kernel tier, GEMM backends, threads (PyTorch's count)");
  m.def("canonical_recipe", &canonical_recipe, "a recipe's canonical name; ValueError when unknown");
  m.def("layer_key", &layer_key, py::arg("seed"), py::arg("step"), py::arg("layer_index"),
        "the threshold key (k0, k1) = fold_in(fold_in(key(seed), step), layer_index) (SPEC section 3)");
}
