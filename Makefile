# ctrain build. `make` builds build/ctrain; `make test` runs every test this machine can run (5-8
# minutes on 2 cores); `make check` the unit tests and the fastest end-to-end runs (under a minute).
# CUDA=auto compiles the CUDA backend when nvcc is found (PATH or /usr/local/cuda/bin); CUDA=0 does not.
VERSION   := 0.1.0
PREFIX    ?= /usr/local
BUILD     ?= build
CUDA      ?= auto
WERROR    ?= 0

CC        ?= cc
CFLAGS_BASE := -std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Wno-unused-parameter -fno-strict-aliasing \
               -pthread -MMD -MP -I. -DCT_VERSION=\"$(VERSION)\"
# -Werror changes no object code, so it stays out of the flags stamp below.
ifeq ($(WERROR),1)
WERROR_FLAG := -Werror
endif
# Per-module SIMD: the CPU kernels are compiled for the host's ISA only when asked (portable default).
CFLAGS    ?=
ALL_CFLAGS = $(CFLAGS_BASE) $(CFLAGS) $(shell pkg-config --cflags libcjson libpng zlib 2>/dev/null) -I/usr/include/openblas
# OpenBLAS is loaded with dlopen (core/cpu/cpu_gemm.c says why); its header gives the types.
# libjpeg: Debian's libjpeg62-turbo (JPEG inputs of webdataset and tfrecord, core/data/jpeg.c).
LDLIBS    = -lcjson -lpng -ljpeg -lz -lm -ldl -pthread
# `make bundle` puts the non-system libraries next to the binaries: look there first. An RPATH, not
# a RUNPATH (--disable-new-dtags): the loader uses a RUNPATH only for the binary's own needs, so
# OpenBLAS's libgfortran would not be found in bundle/lib on a machine without Debian's copy.
LDLIBS   += -Wl,--disable-new-dtags -Wl,-rpath,'$$ORIGIN/lib' -Wl,-rpath,'$$ORIGIN/../lib'

NVCC := $(shell command -v nvcc 2>/dev/null || (test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc))
ifeq ($(CUDA),0)
  NVCC :=
endif
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
# What CUDA_ARCH puts in the library ("sm_80/sm_90/compute_90"): the backend refuses a device none of
# it runs on, naming both (cuda/cuda_backend.cu).
comma := ,
CUDA_ARCH_CODES = $(subst $(eval) ,/,$(strip $(subst code=,,$(filter code=%,$(subst $(comma), ,$(CUDA_ARCH))))))
NVCC_FLAGS = -O3 -std=c++17 $(CUDA_ARCH) -DCT_CUDA_BUILT_FOR=$(CUDA_ARCH_CODES) -I. -Xcompiler -fPIC,-Wall,-Wextra,-Wno-unused-parameter

# Every module folder under core/ (docs/DESIGN.md), and the subcommands of cmd/ (all but main):
# tests call the subcommands too, so they live in libctrain.a with the rest.
# core/dist/comm_mpi.c is not among them: it goes into libctrain_mpi.so (below), which calls
# rendezvous.c's functions in the executable.
MPI_SRC   := core/dist/comm_mpi.c
CORE_SRC  := $(sort $(filter-out $(MPI_SRC),$(shell find core -name '*.c')) $(filter-out cmd/ctrain.c,$(wildcard cmd/*.c)))
CORE_OBJ  := $(CORE_SRC:%.c=$(BUILD)/%.o)
CUDA_SRC  := $(sort $(wildcard cuda/*.cu))
# The CUDA backend is a shared library, build/libctrain_cuda.so, that ctrain loads with dlopen only
# when an NVIDIA driver is present: linking cuBLASLt into ctrain itself costs every CPU run ~210 MB
# of resident memory and ~0.1 s of start-up (measured: docs/DESIGN-NOTES.md, "CUDA backend loading").
# It resolves ct_errf & co. from the executable, which therefore exports its symbols (-rdynamic).
CUDA_LIB  :=
ifneq ($(NVCC),)
  CUDA_HOME := $(patsubst %/bin/nvcc,%,$(NVCC))
  CUDA_OBJ  := $(CUDA_SRC:%.cu=$(BUILD)/%.o)
  CUDA_LIB  := $(BUILD)/libctrain_cuda.so
  CUDA_TEST_LINK := -L$(BUILD) -lctrain_cuda -Wl,-rpath,'$$ORIGIN/..'
  ALL_CFLAGS += -DCT_HAVE_CUDA=1
  LDLIBS    += -rdynamic
  # nvcc-generated launch code and CUB need the C++ runtime.
  CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublasLt -lcublas -lstdc++
endif
# The MPI communicator is a shared library too, build/libctrain_mpi.so, built with mpicc when
# OpenMPI's headers are installed (MPI=auto; MPI=0: not built). ctrain opens it with dlopen only
# when mpirun launched it (core/dist/comm_open.c), so a run of one process never maps libmpi. It
# resolves ct_errf & co. from the executable, which therefore exports its symbols (-rdynamic).
MPI       ?= auto
MPICC     := $(shell command -v mpicc 2>/dev/null)
ifeq ($(MPI),0)
  MPICC :=
endif
MPI_LIB   :=
ifneq ($(MPICC),)
  MPI_LIB := $(BUILD)/libctrain_mpi.so
  LDLIBS  += -rdynamic
endif
TEST_SRC  := $(sort $(wildcard test/test_*.c))
TEST_BIN  := $(TEST_SRC:test/%.c=$(BUILD)/test/%)

.PHONY: all deps deps-bench deps-debian deps-test run test check tests test-cuda gpu-check install uninstall clean bundle \
        bench-kernels \
        check-deps check-deps-test data-text
all: $(BUILD)/ctrain $(CUDA_LIB) $(MPI_LIB)

# Objects depend on the flags they were built with: switching CUDA=0/auto or CUDA_ARCH rebuilds.
FLAGS_STAMP := $(BUILD)/.cflags
CUFLAGS_STAMP := $(BUILD)/.cuflags
$(shell mkdir -p $(BUILD); echo '$(ALL_CFLAGS)' | cmp -s - $(FLAGS_STAMP) || echo '$(ALL_CFLAGS)' > $(FLAGS_STAMP))
$(shell echo '$(NVCC) $(NVCC_FLAGS)' | cmp -s - $(CUFLAGS_STAMP) || echo '$(NVCC) $(NVCC_FLAGS)' > $(CUFLAGS_STAMP))

$(BUILD)/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(WERROR_FLAG) -c $< -o $@

$(BUILD)/%.o: %.cu $(CUFLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) $(if $(WERROR_FLAG),-Werror all-warnings -Xcompiler -Werror) -MMD -MP -c $< -o $@

$(BUILD)/libctrain.a: $(CORE_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/ctrain: $(BUILD)/cmd/ctrain.o $(BUILD)/libctrain.a
	$(CC) $(ALL_CFLAGS) $^ -o $@ $(LDLIBS)

# The kernel workbench (bench/kernels/README.md): compiled, never linked, so it keeps up with cuda/.
BENCH_KERNEL_OBJ := $(patsubst %.cu,$(BUILD)/%.o,$(wildcard bench/kernels/*.cu))
bench-kernels: $(if $(NVCC),$(BENCH_KERNEL_OBJ))
ifeq ($(NVCC),)
	@echo "bench-kernels: no nvcc (CUDA=0, or none on PATH or in /usr/local/cuda/bin)" >&2; exit 1
endif

$(BUILD)/libctrain_cuda.so: $(CUDA_OBJ)
	$(CC) -shared -Wl,-soname,libctrain_cuda.so $^ -o $@ $(CUDA_LIBS)

$(BUILD)/libctrain_mpi.so: $(MPI_SRC) core/dist/comm.h core/dist/launch.h core/dist/rendezvous.h core/dist/watchdog.h $(FLAGS_STAMP)
	$(MPICC) $(ALL_CFLAGS) $(WERROR_FLAG) -fPIC -shared -Wl,-soname,libctrain_mpi.so $(MPI_SRC) -o $@

# test_backend loads stand-ins: a CUDA library built for another op table ...
$(BUILD)/test/libfake_cuda_v1.so: test/fixtures/fake_cuda_lib.c
	@mkdir -p $(dir $@)
	$(CC) -shared -fPIC -DFAKE_ABI=1 $< -o $@
$(BUILD)/test/libfake_cuda_noabi.so: test/fixtures/fake_cuda_lib.c
	@mkdir -p $(dir $@)
	$(CC) -shared -fPIC $< -o $@
# ... one that needs a library no machine has (as libctrain_cuda.so without its libcublasLt.so.13):
# linked against a stub that is then left out of every search path ...
$(BUILD)/test/libfake_cuda_needs.so: test/fixtures/fake_cuda_lib.c
	@mkdir -p $(BUILD)/test/absent
	$(CC) -shared -fPIC -Wl,-soname,libctrain_absent_dep.so.13 -x c /dev/null -o $(BUILD)/test/absent/libctrain_absent_dep.so
	$(CC) -shared -fPIC $< -o $@ -Wl,--no-as-needed -L$(BUILD)/test/absent -lctrain_absent_dep
	rm -rf $(BUILD)/test/absent
# ... and the NVIDIA driver's name (soname libcuda.so.1) for a process that loads it first.
$(BUILD)/test/libfake_driver.so:
	@mkdir -p $(dir $@)
	$(CC) -shared -fPIC -Wl,-soname,libcuda.so.1 -x c /dev/null -o $@
$(BUILD)/test/test_backend: $(BUILD)/test/libfake_cuda_v1.so $(BUILD)/test/libfake_cuda_noabi.so \
    $(BUILD)/test/libfake_cuda_needs.so $(BUILD)/test/libfake_driver.so

# test_nvml loads a stand-in for the driver's libnvidia-ml.so.1.
$(BUILD)/test/libfake_nvml.so: test/fixtures/fake_nvml.c
	@mkdir -p $(dir $@)
	$(CC) -shared -fPIC $< -o $@
$(BUILD)/test/test_nvml: $(BUILD)/test/libfake_nvml.so

# test_hdf5 also runs the HDF5 metadata probe as an executable ($CTRAIN_HDF5_PROBE,
# core/data/hdf5_probe.h), as the fuzz target does.
$(BUILD)/test/hdf5_probe: test/fuzz/hdf5_probe.c $(BUILD)/libctrain.a
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(WERROR_FLAG) $< $(BUILD)/libctrain.a -o $@ $(LDLIBS)
$(BUILD)/test/test_hdf5: $(BUILD)/test/hdf5_probe

# test_cuda* call the CUDA backend's own entry points, so they link the library directly.
$(BUILD)/test/test_cuda%: test/test_cuda%.c $(BUILD)/libctrain.a $(CUDA_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(WERROR_FLAG) $< $(BUILD)/libctrain.a -o $@ $(CUDA_TEST_LINK) $(LDLIBS) $(shell pkg-config --libs check 2>/dev/null || echo -lcheck -lsubunit -lrt -lm)

$(BUILD)/test/%: test/%.c $(BUILD)/libctrain.a
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(WERROR_FLAG) $< $(BUILD)/libctrain.a -o $@ $(LDLIBS) $(shell pkg-config --libs check 2>/dev/null || echo -lcheck -lsubunit -lrt -lm)

# deps-debian: the Debian packages the build and the tests use: the compiler (build-essential: gcc, make,
# libc6-dev, and g++ for nvcc), pkg-config and the libraries, the data set, python3 for the
# end-to-end scripts, and the packages of the commands they run (timeout from coreutils, mount for
# a tmpfs, ...: there on any Debian system, listed so that the list is complete).
# test/check_deps.sh checks that it covers what the Makefile and test/*.sh use. `make deps`
# installs the missing ones, with apt-get's output in $(BUILD)/deps.log; run, test, check and
# test-cuda call it (through check-deps) when one is missing. libhdf5-dev: the headers that type the libhdf5
# functions core/data/hdf5_lib.c loads with dlopen (a build without them leaves HDF5 out), and the
# runtime library it brings; python3-h5py writes the HDF5 test files; python3-venv makes the tests'
# Python environment (deps-test, below: Debian's python3 lacks venv without it); python3-torch (1.13,
# with python3-yaml and python3-requests) runs the transformers of that environment, which
# test/e2e_hf_llama.sh compares Llama models with, and test/ref/gen_layer_refs.py. libdnnl2 (oneDNN) is
# optional at run time: the CPU backend loads it with dlopen when present and then gives it the
# GEMM shapes where it is faster (core/cpu/cpu_onednn.c), and bf16 GEMMs where the CPU has
# AVX512-BF16 or AMX; libdnnl-dev: the headers that type the matmul entry points
# core/cpu/cpu_onednn_bf16.c loads (a build without them leaves native bf16 out).
DEB_PKGS := build-essential pkg-config libcjson-dev libpng-dev libjpeg62-turbo-dev zlib1g-dev libopenblas-dev libhdf5-dev \
            libdnnl2 libdnnl-dev check libsubunit-dev libopenmpi-dev openmpi-bin dataset-fashion-mnist python3 python3-numpy python3-pil \
            python3-h5py python3-venv python3-torch python3-yaml python3-requests \
            coreutils dash diffutils findutils grep libc-bin mawk mount sed util-linux bsdutils base-files

# deps-test: the Python packages of the tests that Debian 12 lacks (tensorboard, pyarrow), pinned in
# datasets/requirements-test.txt, in a virtual environment of the project, $(VENV) (git-ignored),
# made by datasets/venv.sh with Debian's python3 (python3-venv) so that Debian's numpy, h5py and
# Pillow stay visible in it; pip's output in $(BUILD)/venv.log. The tests run its python
# (CT_TEST_VENV). `make deps` installs both; run needs only the Debian packages (check-deps), test
# and check need both (check-deps-test): each installs what is missing first.
VENV      ?= .venv
TEST_REQS := datasets/requirements-test.txt
deps: deps-debian
	@sh datasets/venv.sh --log $(BUILD)/venv.log $(VENV) $(TEST_REQS)

deps-debian:
	@sh datasets/deps.sh --log $(BUILD)/deps.log $(DEB_PKGS)

deps-test: check-deps
	@sh datasets/venv.sh --log $(BUILD)/venv.log $(VENV) $(TEST_REQS)

# deps-bench (opt-in; nothing else runs it): PyTorch 2.x in its own environment $(BENCH_VENV)
# (git-ignored, about 5 GB: PyPI's torch is the CUDA build), for bench/bench_lm.py's comparison on the
# CPU (--torch-python .venv-bench/bin/python); pinned in datasets/requirements-bench.txt.
BENCH_VENV  ?= .venv-bench
BENCH_REQS  := datasets/requirements-bench.txt
deps-bench: check-deps
	@sh datasets/venv.sh --log $(BUILD)/venv-bench.log $(BENCH_VENV) $(BENCH_REQS)

check-deps:
	@sh datasets/deps.sh --check $(DEB_PKGS) >/dev/null 2>&1 || $(MAKE) --no-print-directory deps-debian

check-deps-test: check-deps
	@sh datasets/venv.sh --check $(VENV) $(TEST_REQS) >/dev/null 2>&1 || $(MAKE) --no-print-directory deps-test

# run, test, check and test-cuda install missing packages first, then build in a fresh make (so
# pkg-config and the libraries it reports are seen), then run: never compiling while apt-get is
# still installing.
run: check-deps
	@$(MAKE) --no-print-directory all
	$(BUILD)/ctrain --config configs/fmnist_mlp.json

# test: every test (CI runs it: .ci/run); a test that finds something `make deps` installs missing
# fails, naming it. check: the day-to-day subset (test/run_tests.sh says which).
test: check-deps-test
	@$(MAKE) --no-print-directory all tests
	@CT_TEST_VENV=$(abspath $(VENV)) sh test/run_tests.sh $(BUILD)

check: check-deps-test
	@$(MAKE) --no-print-directory all tests
	@CT_TEST_VENV=$(abspath $(VENV)) sh test/run_tests.sh $(BUILD) quick

# with nvcc, the tests' build also compiles the kernel workbench, so a change to cuda/'s headers
# that breaks it is seen
tests: $(TEST_BIN) $(if $(NVCC),$(BENCH_KERNEL_OBJ))

test-cuda: check-deps
	@$(MAKE) --no-print-directory all tests
	@sh test/run_tests.sh $(BUILD) cuda

# data-text: byte-level token files (vocabulary 256) for a small language model, from plain text
# every Debian system has: the licences of base-files and each installed package's copyright file
# (plain text by Debian policy). $(sort) orders the names byte-wise, so the same installed packages
# give the same files; eval.bin is the last 5% of the bytes. Output: datasets/text/{train,eval}.bin.
TEXT_SRC = $(sort $(wildcard /usr/share/common-licenses/* /usr/share/doc/*/copyright))
data-text: $(BUILD)/ctrain
	@sh datasets/text_tokens.sh --ctrain $(BUILD)/ctrain --eval-fraction 0.05 datasets/text $(TEXT_SRC)

# bundle/: build/ctrain, the test binaries and scripts, configs, and the shared libraries they link
# that a GPU machine with only the CUDA toolkit and driver lacks (cJSON, OpenBLAS, ...).
bundle: all $(TEST_BIN)
	@sh test/bundle.sh $(BUILD) bundle

# gpu-check: everything that needs a GPU, in one command (test/gpu_check.sh says what), from the
# bundle; on the GPU machine run it inside the bundle (`cd bundle && make gpu-check`).
gpu-check:
	@sh test/gpu_check.sh $(or $(GPU_CHECK_DIR),bundle)

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man1
	install -m 755 $(BUILD)/ctrain $(DESTDIR)$(PREFIX)/bin/ctrain
	$(if $(CUDA_LIB),install -d $(DESTDIR)$(PREFIX)/lib/ctrain && install -m 755 $(CUDA_LIB) $(DESTDIR)$(PREFIX)/lib/ctrain/)
	$(if $(MPI_LIB),install -d $(DESTDIR)$(PREFIX)/lib/ctrain && install -m 755 $(MPI_LIB) $(DESTDIR)$(PREFIX)/lib/ctrain/)
	install -m 644 docs/ctrain.1 $(DESTDIR)$(PREFIX)/share/man/man1/ctrain.1

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/ctrain $(DESTDIR)$(PREFIX)/share/man/man1/ctrain.1
	rm -rf $(DESTDIR)$(PREFIX)/lib/ctrain

clean:
	rm -rf $(BUILD) bundle

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
