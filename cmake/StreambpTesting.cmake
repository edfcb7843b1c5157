# Every test process runs LibTorch (and OpenMP OpenBLAS, and PyTorch in the reference scripts) on
# one thread: `ctest -j 2` on 2 cores then uses the cores without oversubscribing them.
# Oversubscribed, LibTorch's threads wait for each other at every op and a step that takes
# 2 s alone can take minutes (docs/operations.md, "Give the server its cores"). A tool
# given an explicit --threads still uses that many.
set(STREAMBP_TEST_ENVIRONMENT "OMP_NUM_THREADS=1")  # one entry: gtest_discover_tests PROPERTIES take no lists

# Adds STREAMBP_TEST_ENVIRONMENT to every add_test() test of the calling directory; call it
# after the directory's last set_tests_properties (which would replace ENVIRONMENT).
# gtest_discover_tests() tests get it through PROPERTIES ENVIRONMENT instead.
function(streambp_test_environment)
  get_property(tests DIRECTORY PROPERTY TESTS)
  if(tests)
    set_property(TEST ${tests} APPEND PROPERTY ENVIRONMENT ${STREAMBP_TEST_ENVIRONMENT})
  endif()
endfunction()
