"""Project macros: one place for our copts, and the nvcc rule for .cu files.

satdar_cc_library / satdar_cc_binary / satdar_cc_test wrap the native rules with the project's
warning flags (warnings are errors in our code; system headers stay quiet).
satdar_cuda_library compiles .cu files with nvcc for sm_80 and sm_90 when the toolkit was
detected (see cuda_configure.bzl); without it, it is a header-only library and code that uses
it sees no SATDAR_WITH_CUDA define.
"""

load("@local_cuda//:defs.bzl", "CUDA_ENABLED", "CUDA_ROOT", "CUDA_SIM")

SATDAR_COPTS = [
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wno-sign-compare",
    "-Wno-unused-parameter",
    "-fno-exceptions",
    # `#pragma omp simd` on reduction loops (no OpenMP runtime): lets the compiler vectorise
    # sums it may not reorder on its own; the order is fixed at compile time.
    "-fopenmp-simd",
]

def satdar_cc_library(name, copts = [], **kwargs):
    native.cc_library(name = name, copts = SATDAR_COPTS + copts, **kwargs)

def satdar_cc_binary(name, copts = [], **kwargs):
    native.cc_binary(name = name, copts = SATDAR_COPTS + copts, **kwargs)

def satdar_cc_test(name, copts = [], deps = [], **kwargs):
    native.cc_test(
        name = name,
        copts = SATDAR_COPTS + copts,
        deps = deps + ["@system//:gtest_main"],
        **kwargs
    )

def cuda_enabled():
    return CUDA_ENABLED

NVCC_FLAGS = " ".join([
    "-O3",
    "-std=c++17",
    "-Xcompiler -fPIC",
    "-Xcompiler -Wall",
    "--expt-relaxed-constexpr",
    "-gencode arch=compute_80,code=sm_80",
    "-gencode arch=compute_90,code=sm_90",
    "-I.",
])

def satdar_cuda_library(name, srcs = [], hdrs = [], deps = [], nvcc_hdrs = [], **kwargs):
    """Kernels: .cu sources compiled by nvcc into a cc_library (only when CUDA is enabled).

    A .cu file holds __global__ kernels and host launchers with plain C++ signatures (no Abseil
    in device code); the .cc code that calls them is compiled by g++ and guarded by
    SATDAR_WITH_CUDA. Without the toolkit this is an empty library.

    nvcc_hdrs: the project headers from other packages that the .cu files include (directly or
    through hdrs), e.g. //core:nvcc_hdrs; they are inputs of each nvcc step besides hdrs, so
    the step also works in a sandbox. They are not exported by the library.
    """
    if not CUDA_ENABLED:
        native.cc_library(name = name, hdrs = hdrs, deps = deps, **kwargs)
        return
    if CUDA_SIM:
        _sim_cuda_library(name, srcs, hdrs, deps, nvcc_hdrs, **kwargs)
        return
    objs = []
    for src in srcs:
        obj = name + "_" + src.replace("/", "_").replace(".cu", ".o")
        native.genrule(
            name = obj + "_nvcc",
            srcs = [src] + hdrs + nvcc_hdrs,
            outs = [obj],
            cmd = "%s/bin/nvcc %s -c $(location %s) -o $@" % (CUDA_ROOT, NVCC_FLAGS, src),
            message = "nvcc " + src,
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cudart"],
        **kwargs
    )

# Warnings the host compiler gives on kernel code written for nvcc (a `__shared__` array a
# helper only writes, parameters of launch-bounded kernels) are not errors in the simulator.
SIM_CUDA_COPTS = [
    "-include",
    "core/cuda/sim/prelude.h",
    "-Wno-unused-variable",
    "-Wno-unused-but-set-variable",
    "-Wno-unknown-pragmas",  # `#pragma unroll`
]

def _sim_cuda_library(name, srcs, hdrs, deps, nvcc_hdrs, **kwargs):
    """The CUDA simulator build: each .cu is copied to a .cc and compiled by the host compiler
    with core/cuda/sim/prelude.h force-included (qualifiers, built-in variables, barriers,
    warp collectives); the simulated runtime, cuBLASLt and NCCL come with @local_cuda."""
    ccs = []
    for src in srcs:
        cc = name + "_sim_" + src.replace("/", "_").replace(".cu", ".cc")
        native.genrule(
            name = cc + "_copy",
            srcs = [src],
            outs = [cc],
            cmd = "cp $< $@",
            message = "cuda sim " + src,
        )
        ccs.append(cc)
    native.cc_library(
        name = name,
        srcs = ccs + nvcc_hdrs,
        hdrs = hdrs,
        copts = SATDAR_COPTS + SIM_CUDA_COPTS,
        # The .cuh headers (not C++ header types to Bazel) as textual headers.
        deps = deps + ["@local_cuda//:cudart", "//core:cuda_device_hdrs"],
        **kwargs
    )

def satdar_grpc_library(name, src, deps = [], proto_deps = [], **kwargs):
    """A .proto file's C++ messages and gRPC stubs: protoc with Debian's grpc_cpp_plugin.

    src is a path inside this package ("satdar/v1/control.proto"); the generated headers are
    included by their repository path ("proto/satdar/v1/control.grpc.pb.h"). proto_deps: the
    .proto files src imports (by repository path), whose libraries are in deps.
    """
    base = src[:-len(".proto")]
    outs = [base + ext for ext in [".pb.h", ".pb.cc", ".grpc.pb.h", ".grpc.pb.cc"]]
    native.genrule(
        name = name + "_protoc",
        srcs = [src] + proto_deps,
        outs = outs,
        cmd = ("/usr/bin/protoc -I. --cpp_out=$(GENDIR) --grpc_out=$(GENDIR) " +
               "--plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin $(location %s)") % src,
        message = "protoc " + src,
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["@system//:grpc"],
        **kwargs
    )
