# ctest helper: runs COMMAND (a ;-list), expects a non-zero exit status and
# stderr matching EXPECT (a regex). Usage:
#   cmake -DCOMMAND="prog;arg" -DEXPECT="regex" -P expect_failure.cmake
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(status EQUAL 0)
  message(FATAL_ERROR "expected a failure, got exit status 0\nstdout: ${out}\nstderr: ${err}")
endif()
if(NOT err MATCHES "${EXPECT}")
  message(FATAL_ERROR "stderr does not match '${EXPECT}'\nstderr: ${err}")
endif()
message(STATUS "failed as expected (${status}): ${err}")
