// pyshard.jax's way into the core: one XLA FFI handler, `pyshard_step`, that runs a core step
// registered from Python on the buffers XLA hands it.
//
// pyshard/jax builds its steps with the same planner and the same core step objects as the
// numpy path (an ExchangeStep, AllgathervStep, AllreduceStep, ReduceScatterStep, or a
// HaloStep's update or fold), registers each here once, and lowers every call to a custom
// call whose one attribute is the step's small integer id: the lowered program carries no
// pointer or communicator handle, so it is the same on every run of a program and JAX's
// compilation cache keeps working. Python keeps the step objects alive for the process.
//
// The handler takes (source, token) and returns (result, token): the token threads JAX's
// ordered effect through every pyshard call, so XLA runs them one at a time, in program
// order, on every rank (two independent collectives in one jit cannot cross).
//
// A second handler, `pyshard_fft`, runs one local c2c FFT pass in place on XLA's buffer
// through a Python function pyshard.jax sets (scipy.fft, whose pocketfft takes a strided axis
// at about a third of jnp.fft's time on XLA:CPU): no MPI, no token.
//
// A third, `pyshard_step` registered for the CUDA platform, runs the same steps on device
// buffers: the core's CUDA packer on XLA's stream (pack kernel, then MPI, staged through host
// memory or CUDA-aware as the step's transport says, then unpack), as cupy arrays run. Its
// steps are registered with device=True (pyshard.jax builds them on the device route); a
// halo fold on device is not registered (its combine runs on the host only).
// The XLA FFI headers are vendored (third_party/xla, Apache-2.0, from jaxlib 0.10.2): the
// handler builds whether or not jax is installed.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings_common.h"
#include "exchange.h"
#include "gather.h"
#include "halo.h"
#include "reduce.h"
#include "shm_exchange.h"
#include "xla/ffi/api/ffi.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

namespace ffi = xla::ffi;

namespace pyshard::bind {
namespace {

struct JaxEntry {
  std::function<void(const char*, char*, Packer&)> run;
  int64_t src_bytes, dst_bytes;
  std::string what;
  bool in_place = false;  // a halo step: XLA hands one buffer as both (operand_output_aliases)
  bool device = false;    // runs on device buffers (the CUDA handler), else host buffers
  std::shared_ptr<Comm> comm;  // the step's communicator: released by Mesh.free()
};

std::mutex registry_mu;
std::vector<std::unique_ptr<JaxEntry>> registry;  // never shrinks: ids stay valid

int64_t add(std::unique_ptr<JaxEntry> e) {
  std::lock_guard<std::mutex> lock(registry_mu);
  registry.push_back(std::move(e));
  return static_cast<int64_t>(registry.size()) - 1;
}

const JaxEntry* find(int64_t id) {
  std::lock_guard<std::mutex> lock(registry_mu);
  if (id < 0 || id >= static_cast<int64_t>(registry.size())) return nullptr;
  return registry[static_cast<size_t>(id)].get();
}

template <class StepT>
std::unique_ptr<JaxEntry> step_entry(StepT* s, int64_t sb, int64_t db, const char* what) {
  auto e = std::make_unique<JaxEntry>();
  e->run = [s](const char* src, char* dst, Packer& pk) { s->run(src, dst, pk); };
  e->src_bytes = sb;
  e->dst_bytes = db;
  e->what = what;
  return e;
}

// The entry a call names, checked against the buffers' sizes and the handler's memory.
ffi::Error entry_for(int64_t step, bool device, int64_t sb, int64_t db, const JaxEntry** out) {
  if (mpi::finalized())  // (MPICH would end the process with its own message)
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "pyshard: MPI was finalized (MPI.Finalize()): pyshard cannot communicate "
                      "any more");
  const JaxEntry* e = find(step);
  if (e == nullptr)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "pyshard: custom call names step " + std::to_string(step) +
                          ", which this process never registered (a program lowered in "
                          "another process?)");
  if (e->comm && e->comm->get() == MPI_COMM_NULL)  // (MPI would name a null communicator)
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "pyshard: the mesh of " + e->what +
                          " was freed (Mesh.free()): a function compiled on it cannot run any "
                          "more; make a new Mesh and call the function with arrays on it");
  if (e->device != device)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "pyshard: " + e->what + " registered for " +
                          (e->device ? "device" : "host") + " buffers runs on " +
                          (device ? "a GPU" : "the CPU"));
  if (sb != e->src_bytes || db != e->dst_bytes)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "pyshard: " + e->what + " got " + std::to_string(sb) + " -> " +
                          std::to_string(db) + " bytes, planned " +
                          std::to_string(e->src_bytes) + " -> " + std::to_string(e->dst_bytes));
  *out = e;
  return ffi::Error::Success();
}

ffi::Error run_step(ffi::AnyBuffer src, ffi::Token, ffi::Result<ffi::AnyBuffer> dst,
                    ffi::Result<ffi::Token>, int64_t step) {
  const int64_t sb = static_cast<int64_t>(src.size_bytes());
  const int64_t db = static_cast<int64_t>(dst->size_bytes());
  const JaxEntry* e = nullptr;
  if (ffi::Error err = entry_for(step, false, sb, db, &e); err.failure()) return err;
  const char* s = static_cast<const char*>(src.untyped_data());
  char* d = static_cast<char*>(dst->untyped_data());
  try {
    // XLA may give the result the source's buffer (the source dead after the call): MPI
    // takes no aliased buffers, so the source is copied aside first
    // (MPICH refuses equal pointers even where one side counts nothing: an empty shard)
    thread_local std::vector<char> aside;
    static char none[8];
    if (!e->in_place && (s == d || (s < d + db && d < s + sb))) {
      if (db == 0) {
        d = none;
      } else if (sb == 0) {
        s = none;
      } else {
        aside.assign(s, s + sb);
        s = aside.data();
      }
    }
    // XLA's result is usually fresh pages (its allocator maps big buffers anew each call):
    // advised to use huge pages, the step's writes fault them in 2 MiB at a time
    if (d != s && db >= kHugeFromBytes) advise_huge_pages(d, db);
    e->run(s, d, host_packer());
  } catch (const std::exception& ex) {
    return ffi::Error(ffi::ErrorCode::kInternal, ex.what());
  }
  return ffi::Error::Success();
}

// What the CUDA handler's last call saw (a diagnostic: scripts/gpu_jax_diag.py compares it
// with the pointers of the arrays JAX hands back)
struct LastCall {
  std::uintptr_t src = 0, dst = 0, stream = 0;
  int64_t step = -1, calls = 0, tid = 0;
  int64_t active = 0, overlaps = 0;  // calls running now; calls that began while one ran
  std::vector<int64_t> tids;         // the threads that have run a call
};
std::mutex last_mu;
LastCall last_cuda;

// Records a call for jax_last_cuda_call and counts it in flight while it lives (two at once
// in one process would mean XLA runs two steps concurrently: their MPI could then meet the
// wrong peers'), under one lock each way.
struct InFlight {
  InFlight(const char* s, const char* d, void* stream, int64_t step) {
    std::lock_guard<std::mutex> lock(last_mu);
    LastCall& c = last_cuda;
    c.src = reinterpret_cast<std::uintptr_t>(s);
    c.dst = reinterpret_cast<std::uintptr_t>(d);
    c.stream = reinterpret_cast<std::uintptr_t>(stream);
    c.step = step;
    ++c.calls;
    c.tid = static_cast<int64_t>(::syscall(SYS_gettid));
    if (std::find(c.tids.begin(), c.tids.end(), c.tid) == c.tids.end()) c.tids.push_back(c.tid);
    if (c.active++ > 0) ++c.overlaps;
  }
  ~InFlight() {
    std::lock_guard<std::mutex> lock(last_mu);
    --last_cuda.active;
  }
};

// The CUDA platform's handler: the step on XLA's device buffers, its kernels on XLA's stream
// (the step synchronizes that stream before MPI touches the buffers, as a cupy call does).
ffi::Error run_step_cuda(void* stream, ffi::AnyBuffer src, ffi::Token,
                         ffi::Result<ffi::AnyBuffer> dst, ffi::Result<ffi::Token>, int64_t step) {
  const int64_t sb = static_cast<int64_t>(src.size_bytes());
  const int64_t db = static_cast<int64_t>(dst->size_bytes());
  const JaxEntry* e = nullptr;
  if (ffi::Error err = entry_for(step, true, sb, db, &e); err.failure()) return err;
  const char* s = static_cast<const char*>(src.untyped_data());
  char* d = static_cast<char*>(dst->untyped_data());
  InFlight in_flight(s, d, stream, step);
  char* aside = nullptr;  // outside the try: released on a throw too (after the stream drains)
  Packer* packer = nullptr;
  try {
    // Synchronous on both ends: the call waits for every stream before it reads its
    // operand, and for its own stream before it returns. The GPU runs of 2026-12-04/05 gave
    // wrong results on some ranks (eager and in gradient programs) and once an illegal
    // memory access; the cause found after them was the packer's kernel-table upload on the
    // legacy default stream, unordered with XLA's non-blocking stream (cuda_packer.cu,
    // upload). That is fixed and not yet run on a GPU: the CUDA lowering stays opt-in
    // (PYSHARD_JAX_CUDA, docs/jax.md), and these waits stay until it has run clean.
    Packer& pk = cuda_packer();
    packer = &pk;
    pk.sync_device();
    pk.set_stream(reinterpret_cast<std::uintptr_t>(stream));
    // the source aliasing the result (see run_step): copied aside on the device first
    if (!e->in_place && sb > 0 && db > 0 && s < d + db && d < s + sb) {
      aside = pk.alloc(sb);
      pk.copy_bytes(aside, s, sb);
      s = aside;
    }
    e->run(s, d, pk);
    pk.sync();
    if (aside != nullptr) pk.release(aside, sb);
  } catch (const std::exception& ex) {
    if (aside != nullptr) {  // no kernel may still read it when the pool hands it out again
      try {
        packer->sync();
      } catch (...) {
      }
      packer->release(aside, sb);
    }
    return ffi::Error(ffi::ErrorCode::kInternal, ex.what());
  }
  return ffi::Error::Success();
}

// ---- pyshard_fft: a local c2c pass in place through a Python function (scipy.fft)

// set once by pyshard.jax (a function (array, axes, inverse, norm) that transforms the array
// in place); never freed: the handler may run until the interpreter is gone
py::object* fft_function = nullptr;

ffi::Error run_fft(ffi::AnyBuffer src, ffi::Result<ffi::AnyBuffer> dst,
                   ffi::Span<const int64_t> axes, int64_t inverse, int64_t norm) {
  const ffi::DataType t = src.element_type();
  if (t != dst->element_type() || (t != ffi::DataType::C64 && t != ffi::DataType::C128))
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "pyshard: pyshard_fft takes complex64 or complex128 to the same dtype");
  const size_t nb = src.size_bytes();
  if (nb != dst->size_bytes())
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "pyshard: pyshard_fft: source and result sizes differ");
  if (fft_function == nullptr)
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "pyshard: pyshard_fft called before pyshard.jax set its function");
  char* d = static_cast<char*>(dst->untyped_data());
  const char* s = static_cast<const char*>(src.untyped_data());
  if (s != d && nb) {  // (XLA did not give the source's buffer: a fresh one, most likely)
    if (static_cast<i64>(nb) >= kHugeFromBytes) advise_huge_pages(d, static_cast<i64>(nb));
    std::memcpy(d, s, nb);
  }
  const auto dims = dst->dimensions();
  try {
    py::gil_scoped_acquire gil;
    std::vector<py::ssize_t> shape(dims.begin(), dims.end());
    py::dtype dt(t == ffi::DataType::C64 ? "complex64" : "complex128");
    // a view of XLA's buffer (the capsule as its base: no copy, writeable)
    py::capsule base(d, [](void*) {});
    py::array view(dt, shape, d, base);
    py::tuple ax(axes.size());
    for (size_t i = 0; i < axes.size(); ++i) ax[i] = py::int_(axes[i]);
    (*fft_function)(view, ax, inverse != 0, norm);
  } catch (const py::error_already_set& e) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("pyshard_fft: ") + e.what());
  } catch (const std::exception& e) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("pyshard_fft: ") + e.what());
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(pyshard_fft_ffi, run_fft,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<ffi::Span<const int64_t>>("axes")
                                  .Attr<int64_t>("inverse")
                                  .Attr<int64_t>("norm"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(pyshard_step_ffi, run_step,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Token>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Token>()
                                  .Attr<int64_t>("step"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(pyshard_step_cuda_ffi, run_step_cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<void*>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Token>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Token>()
                                  .Attr<int64_t>("step"));

void bind_jax(py::module_& m) {
  m.def("jax_cuda_handler",
        []() { return py::capsule(reinterpret_cast<void*>(&pyshard_step_cuda_ffi)); },
        "The XLA FFI handler of pyshard.jax's custom calls on the CUDA platform (device "
        "buffers, XLA's stream); its steps are registered with device=True.");
  m.def("jax_handler", []() { return py::capsule(reinterpret_cast<void*>(&pyshard_step_ffi)); },
        "The XLA FFI handler of pyshard.jax's custom calls (a PyCapsule for "
        "jax.ffi.register_ffi_target).");
  m.def(
      "jax_register_step",
      [](py::object step, int64_t src_bytes, int64_t dst_bytes, bool device,
         std::shared_ptr<Comm> comm) -> int64_t {
        std::unique_ptr<JaxEntry> e;
        if (py::isinstance<ExchangeStep>(step))
          e = step_entry(step.cast<ExchangeStep*>(), src_bytes, dst_bytes, "an exchange");
        else if (py::isinstance<AllgathervStep>(step))
          e = step_entry(step.cast<AllgathervStep*>(), src_bytes, dst_bytes, "a gather");
        else if (py::isinstance<AllreduceStep>(step))
          e = step_entry(step.cast<AllreduceStep*>(), src_bytes, dst_bytes, "an allreduce");
        else if (py::isinstance<ShmExchangeStep>(step))
          e = step_entry(step.cast<ShmExchangeStep*>(), src_bytes, dst_bytes,
                         "an exchange through node-shared memory");
        else if (py::isinstance<ReduceScatterStep>(step))
          e = step_entry(step.cast<ReduceScatterStep*>(), src_bytes, dst_bytes,
                         "a reduce-scatter");
        else
          throw std::invalid_argument("pyshard: jax_register_step takes an MPI step of the core "
                                      "(ExchangeStep, AllgathervStep, AllreduceStep, "
                                      "ReduceScatterStep)");
        e->device = device;
        e->comm = std::move(comm);
        return add(std::move(e));
      },
      py::arg("step"), py::arg("src_bytes"), py::arg("dst_bytes"), py::arg("device") = false,
      py::arg("comm") = nullptr,
      "Register a core step for pyshard_step custom calls (device: on the CUDA platform's "
      "handler, device buffers; comm: the step's communicator, whose release makes a call "
      "fail with a clear message); returns its id. The caller keeps the step alive.");
  m.def(
      "jax_register_halo",
      [](HaloStep* s, int64_t bytes, bool fold, int op, int kind, bool device,
         std::shared_ptr<Comm> comm) -> int64_t {
        auto e = std::make_unique<JaxEntry>();
        e->run = [s, bytes, fold, op, kind](const char* src, char* dst, Packer& pk) {
          if (src != dst) pk.copy_bytes(dst, src, bytes);
          s->start(dst, pk);
          if (fold)
            s->wait(dst, pk, static_cast<FoldOp>(op), static_cast<FoldKind>(kind));
          else
            s->wait(dst, pk);
        };
        e->src_bytes = e->dst_bytes = bytes;
        e->in_place = true;
        e->device = device;
        e->what = fold ? "a halo fold" : "a halo update";
        e->comm = std::move(comm);
        return add(std::move(e));
      },
      py::arg("step"), py::arg("bytes"), py::arg("fold"), py::arg("op") = 0,
      py::arg("kind") = -1, py::arg("device") = false, py::arg("comm") = nullptr,
      "Register a halo step's update (fold=False) or fold (op, kind: cpp/halo.h FoldOp, "
      "FoldKind) of a padded array of `bytes` for pyshard_step custom calls (device: an "
      "update on the CUDA platform's handler); returns its id.");
  m.def("jax_fft_handler",
        []() { return py::capsule(reinterpret_cast<void*>(&pyshard_fft_ffi)); },
        "The XLA FFI handler of pyshard.jax's local FFT passes (pyshard_fft: c2c in place on "
        "XLA's buffer, through the function jax_set_fft_function set).");
  m.def(
      "jax_set_fft_function",
      [](py::object fn) {
        if (fft_function == nullptr) fft_function = new py::object(std::move(fn));
        else *fft_function = std::move(fn);
      },
      py::arg("fn"),
      "Set the function pyshard_fft calls with (array, axes, inverse, norm): it transforms "
      "the array (a view of XLA's buffer) in place.");
  m.def(
      "jax_last_cuda_call",
      []() {
        std::lock_guard<std::mutex> lock(last_mu);
        py::dict d;
        d["src"] = last_cuda.src;
        d["dst"] = last_cuda.dst;
        d["stream"] = last_cuda.stream;
        d["step"] = last_cuda.step;
        d["calls"] = last_cuda.calls;
        d["tid"] = last_cuda.tid;
        py::list tids;
        for (int64_t t : last_cuda.tids) tids.append(t);
        d["tids"] = tids;
        d["overlaps"] = last_cuda.overlaps;
        return d;
      },
      "What the CUDA handler's last pyshard_step call saw: its source and result pointers, "
      "XLA's stream, the step id, how many calls so far, the thread that ran it (tid; tids: "
      "every thread so far) and how many calls began while another ran (a diagnostic).");
  m.def(
      "jax_registered", []() {
        std::lock_guard<std::mutex> lock(registry_mu);
        return registry.size();
      },
      "How many steps pyshard_step custom calls can name.");
}

}  // namespace pyshard::bind
