"""Detects the CUDA toolkit and writes the @local_cuda repository.

The toolkit is used when $CUDA_PATH/bin/nvcc exists (default /usr/local/cuda), unless
SATDAR_CUDA=0 is given with --repo_env. SATDAR_CUDA=1 makes a missing toolkit an error.
@local_cuda//:defs.bzl says CUDA_ENABLED; @local_cuda//:cudart is the runtime (headers,
-lcudart and the SATDAR_WITH_CUDA define), or an empty library without the toolkit.
"""

def _cuda_configure_impl(rctx):
    mode = rctx.os.environ.get("SATDAR_CUDA", "auto")
    root = rctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    if mode not in ["auto", "0", "1"]:
        fail("SATDAR_CUDA must be 0, 1 or auto, got '%s'" % mode)
    found = rctx.path(root + "/bin/nvcc").exists
    if mode == "1" and not found:
        fail("SATDAR_CUDA=1 but there is no nvcc at %s/bin/nvcc" % root)
    enabled = found and mode != "0"
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
    else:
        build = """
package(default_visibility = ["//visibility:public"])
exports_files(["defs.bzl"])
cc_library(name = "cudart")
"""
    rctx.file("BUILD.bazel", build)
    rctx.file("defs.bzl", "CUDA_ENABLED = %s\nCUDA_ROOT = '%s'\n" % (enabled, root))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["SATDAR_CUDA", "CUDA_PATH"],
    local = True,
)
