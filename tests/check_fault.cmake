# "iha check" on kernels with a planted fault must fail: a copy of cl/ with one fault at a time,
# read through IHA_KERNEL_DIR, must give exit status 1 and a FAILED row of the family that runs
# the faulty kernel (and a row that names the faulty case). A check that cannot fail is no check.
#   cmake -DIHA=<path to iha> -DSOURCE=<repository> -DWORK=<scratch directory> -P check_fault.cmake
cmake_minimum_required(VERSION 3.16)

# Copies cl/ into WORK/name, makes each replacement (pairs of from, to in ARGN) in `file`, each
# of which must change it, runs `iha check --family family` on the copy and expects exit status
# 1, a FAILED `family` row and a line matching `expect`.
function(expect_fault name file family expect)
  set(dir "${WORK}/${name}")
  file(REMOVE_RECURSE "${dir}")
  file(COPY "${SOURCE}/cl/" DESTINATION "${dir}")
  file(READ "${dir}/${file}" text)
  set(pairs ${ARGN})
  while(pairs)
    list(POP_FRONT pairs from to)
    string(REPLACE "${from}" "${to}" faulty "${text}")
    if(faulty STREQUAL text)
      message(FATAL_ERROR "${name}: '${from}' is not in cl/${file}: the planted fault needs updating")
    endif()
    set(text "${faulty}")
  endwhile()
  file(WRITE "${dir}/${file}" "${text}")
  execute_process(
    COMMAND ${CMAKE_COMMAND} -E env IHA_KERNEL_DIR=${dir} IHA_PROFILE=off "${IHA}" check --family ${family}
    RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE errors)
  if(NOT status EQUAL 1)
    message(FATAL_ERROR "${name}: iha check exited with ${status}, expected 1:\n${out}${errors}")
  endif()
  if(NOT out MATCHES "\n${family} [^\n]* FAILED ")
    message(FATAL_ERROR "${name}: no FAILED ${family} row:\n${out}")
  endif()
  if(NOT out MATCHES "${expect}")
    message(FATAL_ERROR "${name}: no line matches '${expect}':\n${out}")
  endif()
  message(STATUS "${name}: iha check failed as it should")
endfunction()

# The collapse's sign, in both of its variants (the element kernel of GPUs, the row kernel of CPUs).
expect_fault(collapse_sign collapse.cl rows "FAILED"
             "fma(rh[m * P + p]" "fma(-rh[m * P + p]" "fma((floatC)(rm[p])" "fma((floatC)(-rm[p])")
# One key fewer at the end of an unmasked window, in the interval every attention variant reads:
# only the windowed cases of mask none see it, so the row must name that case.
expect_fault(window_none masks.clh attention "worst: none windowed"
             "hi = window > 0 ? min(T - 1, (n + window) * P - 1) : T - 1;"
             "hi = window > 0 ? min(T - 1, (n + window - 1) * P - 1) : T - 1;")
