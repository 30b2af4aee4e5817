#!/usr/bin/env bash
# CI stage "package": iha as its users get it. Builds the release tree (reusing build/ from the
# test stage), installs it into a temporary prefix, checks the shared library's SONAME and that
# it exports only the public headers' calls, then builds and runs against the install, through
# find_package (examples/, the C++20 consumer of tests/package, the static library inside a
# shared one) and through pkg-config (C and C++20); then iha as a subproject (FetchContent of
# the commit, add_subdirectory of the tree); then the Debian packages: built with CPack, unpacked
# with dpkg -x, their layout (multiarch, no stray files), Recommends and Maintainer, the manual
# pages (man iha-forward), an example built and run against them, and lintian on them when
# Debian has it (a warning fails the stage unless doc/installation.md explains it); then the Python
# wheel as `pip install ./python` builds it, its package test run on it. When the
# build has libiha_mpi (MPI found, IHA_MPI not OFF), the same for it: its SONAME and exports,
# tests/package/mpi_consumer.c through find_package(iha COMPONENTS mpi), pkg-config iha_mpi,
# add_subdirectory and its Debian packages, run on 2 ranks under mpirun (alone when there is no
# mpirun), tests/package/mpi_consumer.cpp on pkg-config iha_mpi alone, iha-mpi from the
# install; and find_package(iha COMPONENTS mpi) must fail, naming why, on an install without it.
#   .ci/package.sh [build-dir]     (default build)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
build=${1:-build}
jobs=$(nproc)
work=$(mktemp -d "${TMPDIR:-/tmp}/iha-package.XXXXXX")
trap 'rm -rf "$work"' EXIT
step() { echo "== package: $*"; }
# shows TEXT COMMAND...: COMMAND's output contains TEXT (not `| grep -q`, whose early exit
# fails the pipeline under pipefail).
shows() { local out; out=$("${@:2}"); [[ $out == *"$1"* ]]; }
fail() { echo "package: FAILED: $*" >&2; exit 1; }
cxx_flags=(-Wall -Wextra -pedantic -Werror)

step "build $build (Release) and install into a temporary prefix"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release > "$work/configure.log" || { cat "$work/configure.log"; exit 1; }
cmake --build "$build" -j"$jobs"
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" > "$work/install.log"
# The libraries' directory under a prefix: the multiarch lib/<triplet> on Debian
# (CMakeLists.txt), which the packages must use under /usr.
libdir=$(sed -n 's/^CMAKE_INSTALL_LIBDIR:[A-Z]*=//p' "$build/CMakeCache.txt")
if command -v dpkg-architecture > /dev/null; then
  [ "$libdir" = "lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH)" ] || fail "CMAKE_INSTALL_LIBDIR is '$libdir', not Debian's multiarch directory"
fi
version=$(sed -n 's/^#define IHA_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' include/iha.h | paste -sd.)
major=${version%%.*}
lib=$prefix/$libdir/libiha.so.$version
[ -f "$lib" ] || fail "no $lib"
# libiha_mpi is installed exactly when the build has it.
mpi=OFF
[ -f "$prefix/include/iha_mpi.h" ] && mpi=ON
# on_ranks PROGRAM ARGS...: PROGRAM on 2 ranks (Open MPI's mpirun refuses root, and 2 cores
# may be fewer than 2 slots, unless told), or alone as one rank without an mpirun.
on_ranks() {
  if ! command -v mpirun > /dev/null; then
    "$@"
  elif shows "Open MPI" mpirun --version; then
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -n 2 "$@"
  else
    mpirun -n 2 "$@"
  fi
}

step "the shared library: SONAME libiha.so.$major, and exports only the calls of the public headers"
soname=$(readelf -d "$lib" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[ "$soname" = "libiha.so.$major" ] || fail "SONAME is '$soname', not libiha.so.$major"
nm -D --defined-only "$lib" | awk '{print $NF}' | sort > "$work/exported"
grep -hE '^IHA_API ' include/iha*.h | sed -E 's/\(.*//; s/.*[ *]//' | sort > "$work/declared"
if ! diff "$work/declared" "$work/exported" > "$work/symbols.diff"; then
  cat "$work/symbols.diff"
  fail "exported symbols differ from the IHA_API declarations of include/iha*.h (< declared only, > exported only)"
fi
echo "$(wc -l < "$work/exported") symbols, each declared in a public header"
if [ $mpi = ON ]; then
  step "libiha_mpi: SONAME libiha_mpi.so.$major, and exports only the IHA_MPI_API calls of iha_mpi.h"
  mpi_lib=$prefix/$libdir/libiha_mpi.so.$version
  [ -f "$mpi_lib" ] || fail "no $mpi_lib"
  soname=$(readelf -d "$mpi_lib" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
  [ "$soname" = "libiha_mpi.so.$major" ] || fail "SONAME is '$soname', not libiha_mpi.so.$major"
  nm -D --defined-only "$mpi_lib" | awk '{print $NF}' | sort > "$work/mpi_exported"
  grep -hE '^IHA_MPI_API ' include/iha_mpi.h | sed -E 's/\(.*//; s/.*[ *]//' | sort > "$work/mpi_declared"
  if ! diff "$work/mpi_declared" "$work/mpi_exported" > "$work/mpi_symbols.diff"; then
    cat "$work/mpi_symbols.diff"
    fail "libiha_mpi's exported symbols differ from the IHA_MPI_API declarations of include/iha_mpi.h (< declared only, > exported only)"
  fi
  echo "$(wc -l < "$work/mpi_exported") symbols, each declared in iha_mpi.h"
else
  step "libiha_mpi: not in this build (no MPI found, or IHA_MPI=OFF); its checks are skipped"
fi

step "the headers alone: C11, C++17 and C++20 with ${cxx_flags[*]}, g++ and clang++"
printf '#include <iha.h>\n#include <iha_tune.h>\n#include <iha_measure.h>\n#include <iha_multi.h>\nint main(void) { return iha_version_number() == IHA_VERSION_NUMBER ? 0 : 1; }\n' > "$work/header.c"
cc -std=c11 "${cxx_flags[@]}" -fsyntax-only -I"$prefix/include" "$work/header.c"
for cxx in g++ clang++; do
  command -v "$cxx" > /dev/null || fail "$cxx missing (tools/scripts/bootstrap.sh ci-deps installs it)"
  for std in c++17 c++20; do
    "$cxx" -x c++ -std=$std "${cxx_flags[@]}" -fsyntax-only -I"$prefix/include" "$work/header.c"
  done
done

step "find_package(iha): examples/, built and run"
cmake -S examples -B "$work/examples" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release > "$work/examples.log"
cmake --build "$work/examples" -j"$jobs"
for example in host_layer opencl_layer generate train; do
  "$work/examples/$example" > "$work/$example.out" || { cat "$work/$example.out"; fail "examples/$example"; }
  echo "$example: $(tail -n 1 "$work/$example.out")"
done

step "find_package(iha): the C++20 consumer (clang++), and libiha.a inside a shared library"
CXX=clang++ cmake -S tests/package -B "$work/consumer" -DCMAKE_PREFIX_PATH="$prefix" -DIHA_CONSUMER_MPI=$mpi > "$work/consumer.log"
cmake --build "$work/consumer" -j"$jobs"
"$work/consumer/consumer_cxx"
shows "libiha.so.$major => $prefix/$libdir/" ldd "$work/consumer/consumer_cxx" || fail "consumer_cxx does not run with $prefix's libiha.so.$major"
if [ $mpi = ON ]; then
  step "find_package(iha COMPONENTS mpi): tests/package/mpi_consumer.c (iha::iha_mpi), and iha-mpi"
  on_ranks "$work/consumer/mpi_consumer"
  shows "libiha_mpi.so.$major => $prefix/$libdir/" ldd "$work/consumer/mpi_consumer" || fail "mpi_consumer does not run with $prefix's libiha_mpi.so.$major"
  # Its RUNPATH ($ORIGIN/../$libdir) finds the prefix's libraries without LD_LIBRARY_PATH.
  "$prefix/bin/iha-mpi" bench --help > /dev/null
  shows "libiha_mpi.so.$major => $prefix/bin/../$libdir/" ldd "$prefix/bin/iha-mpi" || fail "iha-mpi does not find $prefix's libiha_mpi.so.$major"
  core=$work/prefix-core # libiha alone, as the packages libiha0 and libiha-dev install it
  for component in runtime development; do
    cmake --install "$build" --prefix "$core" --component $component > /dev/null
  done
else
  core=$prefix
fi
step "find_package(iha COMPONENTS mpi) on an install without libiha_mpi: not found, and why"
mkdir -p "$work/probe"
cat > "$work/probe/CMakeLists.txt" << 'CMAKE'
cmake_minimum_required(VERSION 3.16)
project(probe C)
find_package(iha 0.1 REQUIRED OPTIONAL_COMPONENTS mpi)
if(iha_mpi_FOUND OR TARGET iha::iha_mpi OR NOT TARGET iha::iha)
  message(FATAL_ERROR "OPTIONAL_COMPONENTS mpi: iha_mpi_FOUND '${iha_mpi_FOUND}' on an install without it")
endif()
find_package(iha 0.1 REQUIRED COMPONENTS mpi)
CMAKE
if cmake -S "$work/probe" -B "$work/probe/build" -DCMAKE_PREFIX_PATH="$core" > "$work/probe.log" 2>&1; then
  cat "$work/probe.log"
  fail "find_package(iha REQUIRED COMPONENTS mpi) succeeded on an install without libiha_mpi"
fi
shows "installed without libiha_mpi" cat "$work/probe.log" || { cat "$work/probe.log"; fail "the probe failed for another reason"; }
grep -A2 "installed without libiha_mpi" "$work/probe.log" | head -n 3
cmake -S tests/package -B "$work/consumer-static" -DCMAKE_PREFIX_PATH="$prefix" -DIHA_USE_STATIC_LIBS=ON > "$work/consumer-static.log"
cmake --build "$work/consumer-static" -j"$jobs"
[ -f "$work/consumer-static/libconsumer_plugin.so" ] || fail "no shared library linking libiha.a"
"$work/consumer-static/host_layer" > /dev/null
if shows libiha ldd "$work/consumer-static/host_layer"; then fail "IHA_USE_STATIC_LIBS linked libiha.so"; fi

step "pkg-config iha: C and C++20 (g++) on libiha.so, C on libiha.a (--static)"
export PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig
pkg-config --validate iha
[ "$(pkg-config --modversion iha)" = "$version" ] || fail "pkg-config --modversion iha is not $version"
# iha.h includes only OpenCL's headers: the flags name no other library's directory.
read -r cflags < <(pkg-config --cflags iha) # without its trailing blank
[ "$cflags" = "-I$prefix/include" ] || fail "pkg-config --cflags iha is '$cflags', not -I$prefix/include alone"
read -r -a iha_pc <<< "$(pkg-config --cflags --libs iha)"
cc -std=c11 "${cxx_flags[@]}" examples/host_layer.c "${iha_pc[@]}" -Wl,-rpath,"$prefix/$libdir" -o "$work/pc_host_layer"
g++ -std=c++20 "${cxx_flags[@]}" tests/package/consumer.cpp "${iha_pc[@]}" -Wl,-rpath,"$prefix/$libdir" -o "$work/pc_consumer"
"$work/pc_host_layer"
"$work/pc_consumer"
read -r -a iha_pc_static <<< "$(pkg-config --static --libs iha | sed 's/ -liha / /')" # libiha.a instead
cc -std=c11 examples/host_layer.c -I"$prefix/include" "$prefix/$libdir/libiha.a" "${iha_pc_static[@]}" -o "$work/pc_static"
"$work/pc_static" > /dev/null
if shows libiha ldd "$work/pc_static"; then fail "the --static build linked libiha.so"; fi
if [ $mpi = ON ]; then
  step "pkg-config iha_mpi: tests/package/mpi_consumer.c, run on 2 ranks"
  pkg-config --validate iha_mpi
  [ "$(pkg-config --modversion iha_mpi)" = "$version" ] || fail "pkg-config --modversion iha_mpi is not $version"
  echo "iha_mpi.pc: Requires: $(pkg-config --print-requires iha_mpi | paste -sd' ')"
  read -r -a iha_mpi_pc <<< "$(pkg-config --cflags --libs iha_mpi)"
  cc -std=c11 "${cxx_flags[@]}" tests/package/mpi_consumer.c "${iha_mpi_pc[@]}" -lm -Wl,-rpath,"$prefix/$libdir" -o "$work/pc_mpi_consumer"
  on_ranks "$work/pc_mpi_consumer"
  # From C++ too, with pkg-config's flags alone: iha_mpi.h keeps MPI's C++ bindings out.
  g++ -std=c++17 "${cxx_flags[@]}" tests/package/mpi_consumer.cpp "${iha_mpi_pc[@]}" -Wl,-rpath,"$prefix/$libdir" \
      -o "$work/pc_mpi_consumer_cxx"
  on_ranks "$work/pc_mpi_consumer_cxx"
fi
unset PKG_CONFIG_PATH

step "FetchContent: iha as a subproject (library only, no CMocka, the parent's build type kept)"
cmake -S tests/package -B "$work/fetch" -DIHA_CONSUMER_VIA=fetchcontent -DIHA_GIT_REPOSITORY="$root" \
      -DIHA_GIT_TAG="$(git rev-parse HEAD)" -DFETCHCONTENT_QUIET=ON > "$work/fetch.log" || { cat "$work/fetch.log"; exit 1; }
cmake --build "$work/fetch" -j"$jobs"
"$work/fetch/consumer_cxx"

step "add_subdirectory: iha beside a Debug parent with BUILD_SHARED_LIBS=ON (iha::iha is then libiha.so; IHA_MPI=$mpi)"
cmake -S tests/package -B "$work/subdir" -DIHA_CONSUMER_VIA=subdirectory -DIHA_SOURCE_DIR="$root" \
      -DCMAKE_BUILD_TYPE=Debug -DBUILD_SHARED_LIBS=ON -DIHA_MPI=$mpi -DIHA_CONSUMER_MPI=$mpi > "$work/subdir.log" \
  || { cat "$work/subdir.log"; exit 1; }
cmake --build "$work/subdir" -j"$jobs"
"$work/subdir/consumer_cxx"
shows "libiha.so.$major => $work/subdir/iha/" ldd "$work/subdir/consumer_cxx" || fail "iha::iha is not libiha.so with BUILD_SHARED_LIBS=ON"
if [ $mpi = ON ]; then on_ranks "$work/subdir/mpi_consumer"; fi

step "Debian packages: cpack -G DEB, dpkg -x, an example against them"
(cd "$build" && cpack -G DEB -B "$work/deb" > "$work/cpack.log") || { cat "$work/cpack.log"; exit 1; }
debs=()
packages=("libiha${major}" libiha-dev iha-tools)
[ $mpi = OFF ] || packages+=("libiha-mpi${major}" libiha-mpi-dev iha-mpi-tools)
for p in "${packages[@]}"; do
  deb=$(ls "$work/deb/${p}_${version}_"*.deb 2> /dev/null) || fail "no ${p}_${version}_*.deb"
  debs+=("$deb")
  echo "$(basename "$deb"): Depends: $(dpkg-deb -f "$deb" Depends)"
  shows "usr/share/doc/$p/copyright" dpkg-deb -c "$deb" || fail "$p has no copyright file"
  dpkg -x "$deb" "$work/debroot"
done
shows libclblast dpkg-deb -f "${debs[0]}" Depends || fail "libiha$major's dependencies lack CLBlast (shlibdeps)"
# Debian's layout: libraries, CMake package and pkg-config files in the multiarch directory,
# nothing else of ours beside them; a driver recommended, since the ICD loader runs nothing
# without one; a maintainer who is someone.
for deb in "${debs[@]}"; do
  stray=$(dpkg-deb -c "$deb" | awk '{print $6}' | grep -E '^\./usr/lib/.*[^/]$' | grep -v "^\./usr/$libdir/" || true)
  [ -z "$stray" ] || fail "$(basename "$deb") installs outside /usr/$libdir: $stray"
  if shows LICENSE dpkg-deb -c "$deb"; then fail "$(basename "$deb") installs a LICENSE file (copyright holds it)"; fi
  maintainer=$(dpkg-deb -f "$deb" Maintainer)
  [[ $maintainer =~ ^[^\<]+\ \<[^@\>]+@[^\>]+\>$ && $maintainer != *example.org* ]] \
    || fail "$(basename "$deb"): Maintainer '$maintainer' is no one's name and address"
done
for deb in "${debs[0]}" "${debs[2]}"; do
  shows "pocl-opencl-icd | opencl-icd" dpkg-deb -f "$deb" Recommends || fail "$(basename "$deb") recommends no OpenCL driver"
done
# The manual pages: iha(1) and one per command of "iha --help", as man shows them.
for page in iha $("$work/debroot/usr/bin/iha" --help | awk '/^commands:$/ {on = 1; next} on && /^  [a-z]/ {print "iha-" $1}'); do
  [ -f "$work/debroot/usr/share/man/man1/$page.1.gz" ] || fail "iha-tools has no manual page $page(1)"
done
if command -v man > /dev/null; then
  shows "iha forward --in DIR --out FILE" env MANPATH="$work/debroot/usr/share/man" MANWIDTH=100 man -P cat iha-forward \
    || fail "man iha-forward does not show the command's synopsis"
fi
shows "libiha$major (= $version)" dpkg-deb -f "${debs[1]}" Depends || fail "libiha-dev does not depend on libiha$major (= $version)"
for deb in "${debs[@]:0:3}"; do
  if shows mpi dpkg-deb -f "$deb" Depends; then fail "$(basename "$deb") depends on MPI"; fi
done
if [ $mpi = ON ]; then
  shows "libiha$major (= $version)" dpkg-deb -f "${debs[3]}" Depends || fail "libiha-mpi$major does not depend on libiha$major (= $version)"
  shows mpi dpkg-deb -f "${debs[3]}" Depends || fail "libiha-mpi$major's dependencies lack MPI (shlibdeps)"
  shows "libiha-mpi$major (= $version)" dpkg-deb -f "${debs[4]}" Depends || fail "libiha-mpi-dev does not depend on libiha-mpi$major (= $version)"
  shows "libiha-dev (= $version)" dpkg-deb -f "${debs[4]}" Depends || fail "libiha-mpi-dev does not depend on libiha-dev (= $version)"
fi
cmake -S examples -B "$work/deb-examples" -DCMAKE_PREFIX_PATH="$work/debroot/usr" > "$work/deb-examples.log"
cmake --build "$work/deb-examples" -j"$jobs" --target host_layer
"$work/deb-examples/host_layer"
shows "$work/debroot/usr/$libdir/" ldd "$work/deb-examples/host_layer" || fail "the example does not run with the package's libiha"
"$work/debroot/usr/bin/iha" devices > /dev/null
if [ $mpi = ON ]; then
  cmake -S tests/package -B "$work/deb-mpi" -DCMAKE_PREFIX_PATH="$work/debroot/usr" -DIHA_CONSUMER_MPI=ON > "$work/deb-mpi.log"
  cmake --build "$work/deb-mpi" -j"$jobs" --target mpi_consumer
  on_ranks "$work/deb-mpi/mpi_consumer"
  shows "$work/debroot/usr/$libdir/" ldd "$work/deb-mpi/mpi_consumer" || fail "mpi_consumer does not run with the package's libiha_mpi"
  "$work/debroot/usr/bin/iha-mpi" bench --help > /dev/null
fi

if command -v lintian > /dev/null; then
  step "lintian"
  # Any error or warning fails the stage, but for the one doc/installation.md explains: CPack
  # writes ldconfig calls into the libraries' maintainer scripts beside the ldconfig trigger.
  lintian --fail-on error,warning --suppress-tags maintscript-calls-ldconfig "${debs[@]}"
else
  step "lintian: not installed (tools/scripts/bootstrap.sh ci-deps installs it), skipped"
fi
step "the Python wheel built from source (pip wheel ./python), installed, its own library checked"
# The test stage's Python suite ran on a package holding build/'s library; this is the wheel a
# user's `pip install ./python` builds, with the library compiled by its own CMake project.
venv=${IHA_PYTHON_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/iha-python-venv}
python/run_tests.sh --prepare > "$work/python-prepare.log" 2>&1 || { cat "$work/python-prepare.log"; fail "no Python environment"; }
"$venv/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps -C "build-dir=$work/wheel-build" \
  -C cmake.define.IHA_PREBUILT_LIBRARY= -w "$work/wheel" ./python
wheel=("$work"/wheel/iha-*.whl)
shows "iha/libiha.so.0" "$venv/bin/python" -m zipfile -l "${wheel[0]}" || fail "the wheel does not hold iha/libiha.so.0"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall "${wheel[0]}"
(cd python && "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/test_package.py)
step "ok"
