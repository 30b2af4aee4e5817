# "iha bench --json" end to end on a small problem, then with --decode and with --backward (core and layer): the
# exit status, and the report's keys and values that doc/benchmarking.md documents and other
# tools read; and the options that would be ignored, refused with exit status 2. Times and rates are only checked to
# be positive and finite: speed belongs to benchmarks, not to tests.
#   cmake -DIHA=<path to iha> -P check_bench_json.cmake
cmake_minimum_required(VERSION 3.19) # string(JSON)

execute_process(
  COMMAND "${IHA}" bench --n 64 --d 16 --heads 2 --p 2 --layer-n 64 --model-dim 64 --reps 1 --no-cold-start --json
  RESULT_VARIABLE status OUTPUT_VARIABLE report ERROR_VARIABLE errors)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "iha bench exited with ${status}:\n${errors}")
endif()

# Fails unless the member at the given path exists (string(JSON) stops with its own message
# otherwise); `out` receives it.
function(member out)
  string(JSON value GET "${report}" ${ARGN})
  set(${out} "${value}" PARENT_SCOPE)
endfunction()

function(expect_positive)
  member(value ${ARGN})
  list(JOIN ARGN "." path)
  if(NOT value MATCHES "^[0-9.e+-]+$" OR NOT value GREATER 0)
    message(FATAL_ERROR "${path}: expected a positive number, got '${value}'")
  endif()
endfunction()

function(expect_type expected)
  string(JSON type TYPE "${report}" ${ARGN})
  list(JOIN ARGN "." path)
  if(NOT type STREQUAL expected)
    message(FATAL_ERROR "${path}: expected ${expected}, got ${type}")
  endif()
endfunction()

function(expect_equal expected)
  member(value ${ARGN})
  list(JOIN ARGN "." path)
  if(NOT value STREQUAL expected)
    message(FATAL_ERROR "${path}: expected '${expected}', got '${value}'")
  endif()
endfunction()

# The keys every consumer may rely on (the issue's minimum: device, seconds, gflops).
member(device device)
if(device STREQUAL "")
  message(FATAL_ERROR "device: empty")
endif()
expect_positive(seconds)
expect_positive(gflops)

# The host's load average, where the host has one (Linux): a number of at least 0 at both ends,
# and the online CPUs; null elsewhere.
string(JSON load_type TYPE "${report}" host_load)
if(load_type STREQUAL "OBJECT")
  foreach(moment start end)
    member(load host_load ${moment})
    if(NOT load MATCHES "^[0-9.e+-]+$" OR load LESS 0)
      message(FATAL_ERROR "host_load.${moment}: expected a number >= 0, got '${load}'")
    endif()
  endforeach()
  expect_positive(host_load cpus)
elseif(NOT load_type STREQUAL "NULL")
  message(FATAL_ERROR "host_load: expected an object or null, got ${load_type}")
endif()

# The attention core: the problem as asked, its cost over visible pairs, its ratios.
expect_equal(ran attention state)
expect_equal(128 attention t)
expect_equal(causal attention mask)
expect_positive(attention flops)
expect_positive(attention gflops)
foreach(ratio fraction_of_peak_fma fraction_of_clblast_gemm fraction_of_copy_bandwidth)
  expect_positive(attention ${ratio})
endforeach()

# The unfused baseline agrees with the fused kernel.
expect_equal(ran baseline state)
expect_positive(baseline speedup)
member(difference baseline rel_difference)
if(NOT difference LESS 1e-4)
  message(FATAL_ERROR "baseline rel_difference ${difference}: the fused and unfused outputs disagree")
endif()

# The layer, stage by stage.
expect_equal(ran layer state)
foreach(stage projections mixing attention collapse output)
  expect_positive(layer stages ${stage} seconds)
endforeach()
expect_positive(layer stages mixing bytes_per_second)

# The ceilings, with both readings of the compute ceilings; the reported one is the faster.
expect_equal(ran ceilings state)
expect_positive(ceilings copy_bytes_per_second)
expect_positive(ceilings peak_fma_gflops)
member(peak ceilings peak_fma_gflops)
foreach(i 0 1)
  expect_positive(ceilings readings peak_fma_gflops ${i})
  expect_positive(ceilings readings clblast_gemm_gflops ${i})
  member(reading ceilings readings peak_fma_gflops ${i})
  if(reading GREATER peak)
    message(FATAL_ERROR "peak_fma_gflops ${peak} is below its reading ${reading}")
  endif()
endforeach()

# The attention kernel's loops alone: measured where the configuration has them (register
# tiles), otherwise a note says why not.
member(loops ceilings attention_loops state)
if(loops STREQUAL "ran")
  foreach(rate score_gflops pv_gflops gflops)
    expect_positive(ceilings attention_loops ${rate})
  endforeach()
  expect_positive(attention fraction_of_attention_loops)
elseif(loops STREQUAL "not_run")
  member(note ceilings attention_loops note)
else()
  message(FATAL_ERROR "ceilings.attention_loops.state: unexpected '${loops}'")
endif()

# The attention kernel's configuration and where it came from (a profile entry, a built-in
# default or the safe fallback).
expect_type(STRING attention config)
member(source attention config_source)
if(NOT source MATCHES "^(profile_exact|profile_nearest|profile_device_default|builtin|builtin_safe)$")
  message(FATAL_ERROR "attention.config_source: unexpected '${source}'")
endif()
expect_type(STRING attention config_source_bucket)

expect_equal(skipped cold_start state)
expect_equal(skipped decode state)
expect_equal(skipped backward state) # only with --backward

# A decoding step instead of the core, baseline, layer and cold start: those say so, and the
# top-level seconds and gflops (the core's) are null rather than zeros of a run that never was.
execute_process(
  COMMAND "${IHA}" bench --decode --cache-tokens 40 --d 16 --heads 2 --p 2 --model-dim 64 --window 8 --reps 1
          --no-ceilings --json
  RESULT_VARIABLE status OUTPUT_VARIABLE report ERROR_VARIABLE errors)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "iha bench --decode exited with ${status}:\n${errors}")
endif()
expect_type(NULL seconds)
expect_type(NULL gflops)
foreach(section attention baseline backward layer cold_start ceilings)
  expect_equal(skipped ${section} state)
endforeach()
expect_equal(ran decode state)
expect_equal(40 decode cached_tokens)
expect_equal(64 decode model_dim)
expect_equal(8 decode window)
expect_equal(0 decode rope_base)
expect_equal(OFF decode half)
foreach(key step_seconds tokens_per_second attention_seconds cache_bytes_read cache_bytes_per_second
            cache_bytes_per_token)
  expect_positive(decode ${key})
endforeach()
# The window bounds what the new token's queries read: keys and values of W*P pseudo-tokens, for
# each of B*H = 2 sequences, 4 bytes each.
expect_equal(4096 decode cache_bytes_read)
expect_type(NULL decode fraction_of_copy_bandwidth)
expect_type(STRING decode config)
expect_type(STRING decode config_source)
expect_type(NULL decode ring) # only with --ring

# Rotary embedding in the decoding step, on both cache layouts.
execute_process(
  COMMAND "${IHA}" bench --decode --compact --rope-base 500 --cache-tokens 24 --d 16 --heads 2 --p 2 --model-dim 64
          --reps 1 --no-ceilings --json
  RESULT_VARIABLE status OUTPUT_VARIABLE report ERROR_VARIABLE errors)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "iha bench --decode --compact --rope-base exited with ${status}:\n${errors}")
endif()
expect_equal(ran decode state)
expect_equal(500 decode rope_base)
expect_positive(decode step_seconds)
expect_equal(ran decode compact state)
expect_positive(decode compact step_seconds)

# A ring KV cache of 8 tokens beside a full cache at 8, 32 and 128 cached tokens: the ring's
# bytes stay those of L*P + P - 1 rows (15, rounded up to the key block), the full one's grow.
execute_process(
  COMMAND "${IHA}" bench --decode --ring 8 --cache-tokens 8 --d 16 --heads 2 --p 2 --model-dim 64 --window 4
          --reps 1 --no-ceilings --json
  RESULT_VARIABLE status OUTPUT_VARIABLE report ERROR_VARIABLE errors)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "iha bench --decode --ring exited with ${status}:\n${errors}")
endif()
expect_equal(ran decode ring state)
expect_equal(8 decode ring cache_tokens)
member(ring_bytes decode ring positions 0 ring_cache_bytes)
member(full_bytes decode ring positions 2 full_cache_bytes)
foreach(i 0 1 2)
  foreach(key ring_step_seconds full_step_seconds ring_cache_bytes full_cache_bytes)
    expect_positive(decode ring positions ${i} ${key})
  endforeach()
  expect_equal(${ring_bytes} decode ring positions ${i} ring_cache_bytes)
endforeach()
expect_equal(8 decode ring positions 0 cached_tokens)
expect_equal(128 decode ring positions 2 cached_tokens)
if(NOT full_bytes GREATER ring_bytes)
  message(FATAL_ERROR "a full cache of 129 tokens (${full_bytes} bytes) is not larger than a ring of 8 (${ring_bytes})")
endif()

# The backward pass on the core's problem and inputs, beside the core it is compared with.
execute_process(
  COMMAND "${IHA}" bench --backward --n 64 --reps 1 --no-layer --no-baseline --no-cold-start --no-ceilings --json
  RESULT_VARIABLE status OUTPUT_VARIABLE report ERROR_VARIABLE errors)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "iha bench --backward exited with ${status}:\n${errors}")
endif()
expect_equal(ran attention state)
expect_equal(ran backward state)
foreach(key seconds flops gflops forward_seconds backward_over_forward)
  expect_positive(backward ${key})
endforeach()
# FlashAttention-2's count: 10*d per visible pair, 2.5 times the forward's 4*d (exact integers
# in the report), and the forward it is compared with is the core of the same run.
member(forward_flops attention flops)
math(EXPR expected_flops "${forward_flops} * 5 / 2")
expect_equal(${expected_flops} backward flops)
member(forward_seconds attention seconds)
expect_equal(${forward_seconds} backward forward_seconds)
expect_type(NULL backward fraction_of_peak_fma) # --no-ceilings

# With the layer section, --backward also times the layer's backward pass.
execute_process(
  COMMAND "${IHA}" bench --backward --n 16 --d 16 --heads 2 --p 2 --layer-n 32 --model-dim 32 --reps 1 --no-baseline --no-cold-start
          --no-ceilings --json
  RESULT_VARIABLE status OUTPUT_VARIABLE report ERROR_VARIABLE errors)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "iha bench --backward (layer) exited with ${status}:\n${errors}")
endif()
expect_equal(ran layer state)
foreach(key seconds backward_over_forward stage_seconds.attention stage_seconds.projections
            saved_pair.forward_save_seconds saved_pair.backward_saved_seconds saved_pair.step_over_recomputing_step)
  string(REPLACE "." ";" path "backward.${key}")
  expect_positive(layer ${path})
endforeach()
# The saved state: B*H*T*(d+1) floats, B=1 H=2 T=32*2 d=16.
expect_equal(8704 layer backward saved_pair saved_bytes)
expect_equal(OFF layer half_weights)

# The same with the layer's weights, x and z (and dz, dx, the gradients) in half.
execute_process(
  COMMAND "${IHA}" bench --backward --half-weights --n 16 --d 16 --heads 2 --p 2 --layer-n 32 --model-dim 32 --reps 1
          --no-baseline --no-cold-start --no-ceilings --json
  RESULT_VARIABLE status OUTPUT_VARIABLE report ERROR_VARIABLE errors)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "iha bench --backward --half-weights exited with ${status}:\n${errors}")
endif()
expect_equal(ON layer half_weights)
expect_positive(layer seconds)
expect_positive(layer backward seconds)
expect_positive(layer backward saved_pair backward_saved_seconds)

# Options the chosen measurement would ignore are usage errors, not silently dropped.
foreach(arguments "--half" "--half-weights;--no-layer" "--cache-tokens;64" "--ring;8;--window;4"
                  "--decode;--ring;8" "--decode;--ring;4;--window;8" "--decode;--n;64"
                  "--decode;--baseline-reps;2" "--backward;--decode")
  execute_process(COMMAND "${IHA}" bench ${arguments} --json RESULT_VARIABLE status OUTPUT_VARIABLE report
                  ERROR_VARIABLE errors)
  if(NOT status EQUAL 2 OR NOT report STREQUAL "" OR errors STREQUAL "")
    message(FATAL_ERROR "iha bench ${arguments}: expected a usage error (exit status 2, a message on stderr), "
                        "got ${status}")
  endif()
endforeach()

# The cold start: two child processes (empty, then warm program caches), each with its context,
# first and second forward of the layer shape.
execute_process(
  COMMAND "${IHA}" bench --n 16 --d 16 --heads 2 --p 2 --layer-n 32 --model-dim 32 --reps 1 --no-baseline --no-layer
          --no-ceilings --json
  RESULT_VARIABLE status OUTPUT_VARIABLE report ERROR_VARIABLE errors)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "iha bench (cold start) exited with ${status}:\n${errors}")
endif()
expect_equal(ran cold_start state)
foreach(run empty_cache warm_cache)
  foreach(key context_seconds first_forward_seconds second_forward_seconds process_seconds)
    expect_positive(cold_start ${run} ${key})
  endforeach()
endforeach()
