// The tests' main: GoogleTest's, after the process has OpenBLAS's kernels for this CPU, as
// streambp-server and streambp-bench do (UseCpuBlasKernels), so the tests run the products
// the tools ship with.
#include <gtest/gtest.h>

#include "streambp/runtime.h"

int main(int argc, char** argv) {
  streambp::UseCpuBlasKernels(argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
