"""Detects the CUDA toolkit and writes the @local_cuda repository.

The toolkit is used when $CUDA_PATH/bin/nvcc exists (default /usr/local/cuda), unless
SATDAR_CUDA=0 is given with --repo_env. SATDAR_CUDA=1 makes a missing toolkit an error.
SATDAR_CUDA=sim is the CUDA simulator build (docs/GPU.md): the .cu files are compiled by the
host compiler against core/cuda/sim (a simulated runtime, cuBLASLt and NCCL that run on the
CPU); @local_cuda's libraries are aliases of //core/cuda/sim's and CUDA_SIM is True.
@local_cuda//:defs.bzl says CUDA_ENABLED; @local_cuda//:cudart is the runtime (headers,
-lcudart and the SATDAR_WITH_CUDA define), or an empty library without the toolkit.
@local_cuda//:nccl is NCCL (-lnccl and the SATDAR_WITH_NCCL define) when the toolkit has
include/nccl.h and lib64/libnccl.so (NCCL_ENABLED in defs.bzl), else an empty library.
@local_cuda//:cublas links cuBLAS and cuBLASLt (with cudart) when CUDA is enabled, else an
empty library.
"""

def _cuda_configure_impl(rctx):
    mode = rctx.os.environ.get("SATDAR_CUDA", "auto")
    root = rctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    if mode not in ["auto", "0", "1", "sim"]:
        fail("SATDAR_CUDA must be 0, 1, auto or sim, got '%s'" % mode)
    if mode == "sim":
        rctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])
exports_files(["defs.bzl"])
alias(name = "cudart", actual = "@//core/cuda/sim:cudart")
alias(name = "nccl", actual = "@//core/cuda/sim:nccl")
alias(name = "cublas", actual = "@//core/cuda/sim:cublaslt")
""")
        rctx.file("defs.bzl", "CUDA_ENABLED = True\nNCCL_ENABLED = True\nCUDA_SIM = True\nCUDA_ROOT = ''\n")
        return
    found = rctx.path(root + "/bin/nvcc").exists
    if mode == "1" and not found:
        fail("SATDAR_CUDA=1 but there is no nvcc at %s/bin/nvcc" % root)
    enabled = found and mode != "0"
    nccl = enabled and rctx.path(root + "/include/nccl.h").exists and \
           rctx.path(root + "/lib64/libnccl.so").exists
    if enabled:
        rctx.symlink(root + "/include", "include")
        build = """
package(default_visibility = ["//visibility:public"])
exports_files(["defs.bzl"])
cc_library(
    name = "cudart",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp"]),
    includes = ["include"],
    defines = ["SATDAR_WITH_CUDA=1"],
    linkopts = ["-L{root}/lib64", "-Wl,-rpath,{root}/lib64", "-lcudart"],
)
""".format(root = root)
        if nccl:
            build += """
cc_library(
    name = "nccl",
    defines = ["SATDAR_WITH_NCCL=1"],
    linkopts = ["-L{root}/lib64", "-Wl,-rpath,{root}/lib64", "-lnccl"],
    deps = [":cudart"],
)
""".format(root = root)
        else:
            build += """
cc_library(name = "nccl", deps = [":cudart"])
"""
        build += """
cc_library(
    name = "cublas",
    linkopts = ["-L{root}/lib64", "-Wl,-rpath,{root}/lib64", "-lcublasLt", "-lcublas"],
    deps = [":cudart"],
)
""".format(root = root)
    else:
        build = """
package(default_visibility = ["//visibility:public"])
exports_files(["defs.bzl"])
cc_library(name = "cudart")
cc_library(name = "nccl")
cc_library(name = "cublas")
"""
    rctx.file("BUILD.bazel", build)
    rctx.file("defs.bzl", "CUDA_ENABLED = %s\nNCCL_ENABLED = %s\nCUDA_SIM = False\nCUDA_ROOT = '%s'\n" % (enabled, nccl, root))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["SATDAR_CUDA", "CUDA_PATH"],
    local = True,
)
