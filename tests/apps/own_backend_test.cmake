# Runs the own-backend example on 6000 samples for 3 epochs and checks its accuracy:
# a softmax regression reaches about 0.78 there; chance is 0.10.
execute_process(COMMAND ${BINARY} 3 6000 OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the example failed (${rc})")
endif()
string(REGEX MATCH "test accuracy ([0-9.]+)" _ "${out}")
if(NOT CMAKE_MATCH_1 OR CMAKE_MATCH_1 LESS 0.7)
  message(FATAL_ERROR "accuracy '${CMAKE_MATCH_1}' below 0.7: the host backend did not train")
endif()
