# -DCMAKE_PROJECT_INCLUDE=<this file> for a build against the LibTorch of a PyTorch 2.x CUDA
# wheel with Debian's -dev packages unpacked under $STREAMBP_DEB_PREFIX (scripts/gpu/check.sh).
# It runs right after project(), before find_package(Torch); the repository's CMake is unchanged.

# The wheel's LibTorch looks for CUDA::nvToolsExt, which CUDA 12.9+ no longer ships (only the
# header-only nvtx3): an alias to nvtx3.
find_package(CUDAToolkit QUIET)
if(TARGET CUDA::nvtx3 AND NOT TARGET CUDA::nvToolsExt)
  add_library(CUDA::nvToolsExt INTERFACE IMPORTED)
  target_link_libraries(CUDA::nvToolsExt INTERFACE CUDA::nvtx3)
  target_compile_definitions(CUDA::nvToolsExt INTERFACE TORCH_CUDA_USE_NVTX3)
  message(STATUS "gpu overrides: CUDA::nvToolsExt is CUDA::nvtx3")
endif()

# Headers that live in the nvidia-* pip packages beside torch, not in torch/include or the
# toolkit: nccl.h (ProcessGroupNCCL.hpp), cudnn*.h, cusparseLt.h.
foreach(pkg nccl cudnn cusparselt)
  execute_process(
    COMMAND python3 -c "import os, nvidia.${pkg} as m; print(os.path.join(list(m.__path__)[0]))"
    OUTPUT_VARIABLE _dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(_dir AND EXISTS "${_dir}/include")
    include_directories(SYSTEM "${_dir}/include")
    message(STATUS "gpu overrides: ${pkg} headers from ${_dir}/include")
  endif()
endforeach()

# Debian's headers before the wheel's: spdlog 1.10 needs Debian's fmt 9, the generated
# *.pb.h need protobuf 3.21 (a wheel may carry its own copies in torch/include).
if(DEFINED ENV{STREAMBP_DEB_PREFIX})
  # (and the multiarch folder, which Debian's compiler searches only under /usr: OpenSSL's
  # configuration.h lives there)
  include_directories(BEFORE SYSTEM "$ENV{STREAMBP_DEB_PREFIX}/usr/include"
                                    "$ENV{STREAMBP_DEB_PREFIX}/usr/include/x86_64-linux-gnu")
  message(STATUS "gpu overrides: $ENV{STREAMBP_DEB_PREFIX}/usr/include first")
endif()
