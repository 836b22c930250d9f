"""Builds torchquant's optional native kernels (``torchquant/kernels/native/csrc``).

Metadata lives in pyproject.toml; this file only adds the C++ extension.  It needs torch at
build time (``pip install --no-build-isolation`` after torch; the Makefile runs
``setup.py build_ext --inplace`` beside an editable install with TORCHQUANT_BUILD_NATIVE=0);
where torch or a compiler is missing the package installs without it and runs on its Python
kernels.
"""
import os
import sys

from setuptools import setup

ext_modules, cmdclass = [], {}


def _onednn_library_dir():
    """Where the onednn-cpu-gomp wheel put libdnnl.so.3 (its data files go under the
    environment's prefix), or None."""
    for prefix in (sys.prefix, sys.base_prefix):
        lib = os.path.join(prefix, "lib")
        if os.path.exists(os.path.join(lib, "libdnnl.so.3")):
            return lib
    return None


if os.environ.get("TORCHQUANT_BUILD_NATIVE", "1") != "0":
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:  # an isolated build without torch: no native kernels
        print("torchquant: torch not importable at build time; native kernels not built",
              file=sys.stderr)
    else:
        here = os.path.dirname(os.path.abspath(__file__))
        csrc = os.path.join("torchquant", "kernels", "native", "csrc")
        ext_modules = [CppExtension(
            "torchquant.kernels.native._C",
            sources=sorted(os.path.join(csrc, f) for f in os.listdir(os.path.join(here, csrc))
                           if f.endswith(".cpp")),
            # no -march: fbgemm picks AVX2 / AVX-512 / VNNI kernels at run time
            # -fopenmp: ATen's inline parallel_for is OpenMP (libgomp comes with torch)
            # -ffp-contract=off: the fused cell loops round every product / sum as ATen does
            # hidden visibility: the library is loaded RTLD_GLOBAL for its AOTInductor C shims
            # (csrc/aoti_shims.cpp), the only symbols it exports
            # -g0: Python's build flags ask for debug info, which doubled the build's time
            extra_compile_args=["-O3", "-g0", "-fopenmp", "-ffp-contract=off",
                                "-fvisibility=hidden", "-fvisibility-inlines-hidden"],
            extra_link_args=["-fopenmp"],
        )]
        onednn_lib = _onednn_library_dir()
        if onednn_lib is not None:
            # oneDNN's own library (onednn-cpu-gomp: OpenMP, the runtime torch uses) for the
            # conv primitives torchquant keeps between calls; headers: those torch ships
            ext_modules.append(CppExtension(
                "torchquant.kernels.native._onednn",
                sources=sorted(os.path.join(csrc, "onednn", f)
                               for f in os.listdir(os.path.join(here, csrc, "onednn"))
                               if f.endswith(".cpp")),
                extra_compile_args=["-O3", "-g0", "-fvisibility=hidden",
                                    "-fvisibility-inlines-hidden"],
                extra_link_args=[f"-L{onednn_lib}", "-l:libdnnl.so.3",
                                 f"-Wl,-rpath,{onednn_lib}"],
            ))
        else:
            print("torchquant: libdnnl.so.3 (onednn-cpu-gomp) not found; the kept oneDNN conv "
                  "primitives are not built", file=sys.stderr)
        cmdclass = {"build_ext": BuildExtension.with_options(no_python_abi_suffix=True)}

setup(ext_modules=ext_modules, cmdclass=cmdclass)
