# memra — one entry point.
#   make            build everything (CUDA too when nvcc is found)
#   make test       install deps, build, run every test (unit under ASan+UBSan, e2e, fuzz)
#   make run        the main job (see README)
#   make gpu-test   GPU checks (needs a CUDA device)
#   make bench      benchmarks (needs a CUDA device)
#   make deps       install the Debian packages the build needs

BUILD      ?= build
CC         ?= gcc
CLANG      ?= clang
CUDA_HOME  ?= /usr/local/cuda
NVCC       ?= $(CUDA_HOME)/bin/nvcc
# sm_90a is measured (H200); sm_120a (RTX PRO 6000 / 5090) and sm_89 (Ada) must compile.
CUDA_ARCHS ?= 90a 120a 89
FIXTURES   ?= $(abspath ../shared/fixtures)
FUZZ_SECONDS ?= 30

HAVE_NVCC := $(shell test -x $(NVCC) && echo 1)
ifeq ($(NO_CUDA),1)
HAVE_NVCC :=
endif

PKGS       := jansson msgpack libh2o-evloop check
PKG_CFLAGS  = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS    = $(shell pkg-config --libs jansson msgpack libh2o-evloop 2>/dev/null) -lnng -lssl -lcrypto -lz
CHECK_LIBS  = $(shell pkg-config --libs check 2>/dev/null)

WARN       := -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter
CSTD       := -std=gnu11
CPPFLAGS   += -I. -D_GNU_SOURCE
CFLAGS     ?= -O2 -g
CFLAGS     += $(CSTD) $(WARN) -fno-strict-aliasing $(PKG_CFLAGS)
LDLIBS     := $(PKG_LIBS) -lm -lpthread
SAN        := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

# Library sources: every .c directly in a module folder (programs live in */bin/).
LIB_SRC := $(wildcard common/*.c proto/*.c kernels/*.c kernels/cpu/*.c worker/*.c worker/arch/*.c gateway/*.c)
BIN_SRC := $(wildcard common/bin/*.c proto/bin/*.c kernels/bin/*.c worker/bin/*.c gateway/bin/*.c)
CU_SRC  := $(wildcard kernels/cuda/*.cu)
# What kernels/cuda/*.cu include from the tree (cu_common.cuh pulls in
# kernels/ops.h, which pulls in common/err.h and common/quant.h): a change to
# any other header does not rebuild the CUDA objects for every architecture.
CU_HDR  := $(wildcard kernels/cuda/*.cuh kernels/cuda/*.h) kernels/ops.h common/err.h common/quant.h
HDRS    := $(wildcard common/*.h proto/*.h kernels/*.h kernels/cpu/*.h worker/*.h worker/arch/*.h gateway/*.h)
TEST_SRC := $(wildcard tests/unit/test_*.c)
FUZZ_SRC := $(wildcard tests/fuzz/fuzz_*.c)

BINS      := $(patsubst %.c,$(BUILD)/bin/%,$(notdir $(BIN_SRC)))
LIB_OBJ   := $(patsubst %.c,$(BUILD)/obj/%.o,$(LIB_SRC))
ASAN_OBJ  := $(patsubst %.c,$(BUILD)/asan/%.o,$(LIB_SRC))
TESTS     := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(TEST_SRC))
FUZZERS   := $(patsubst tests/fuzz/%.c,$(BUILD)/fuzz/%,$(FUZZ_SRC))

ifeq ($(HAVE_NVCC)$(if $(CU_SRC),1,),11)
CU_OBJ     := $(patsubst kernels/cuda/%.cu,$(BUILD)/cuda/%.o,$(CU_SRC))
NVCC_GENCODE := $(foreach a,$(CUDA_ARCHS),-gencode=arch=compute_$(a),code=sm_$(a))
NVCCFLAGS  ?= -O3 -lineinfo
NVCCFLAGS  += -std=c++17 $(NVCC_GENCODE) -I. -Xcompiler -Wall,-Wextra,-Werror,-Wno-unused-parameter \
              -Werror all-warnings --expt-relaxed-constexpr
CUDA_CPPFLAGS := -DMR_HAVE_CUDA=1
CUDA_LIBS  := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart_static -lcublas -lrt -ldl -lstdc++
else
CU_OBJ     :=
CUDA_CPPFLAGS :=
CUDA_LIBS  :=
endif

.PHONY: all test test-run unit e2e fuzz run gpu-test bench deps clean cuda-note
.DEFAULT_GOAL := all

all: cuda-note $(BINS)

cuda-note:
ifneq ($(HAVE_NVCC),1)
	@echo "memra: no nvcc at $(NVCC): building the CPU backend only (set CUDA_HOME to build CUDA)"
endif

deps:
	@scripts/deps.sh

# `make test` installs what is missing first, then re-enters make so that
# pkg-config sees the installed packages.
test: deps
	@$(MAKE) --no-print-directory -j2 all $(TESTS) $(FUZZERS)
	@$(MAKE) --no-print-directory test-run

test-run:
	@scripts/run-tests.sh "$(BUILD)" "$(FIXTURES)" "$(FUZZ_SECONDS)"

run: deps
	@$(MAKE) --no-print-directory -j2 all
	@scripts/run.sh "$(BUILD)" "$(FIXTURES)"

gpu-test: all
	@scripts/gpu-test.sh "$(BUILD)" "$(FIXTURES)"

bench: all
	@scripts/bench.sh "$(BUILD)"

clean:
	rm -rf $(BUILD)

# ---- release objects and programs ----
$(BUILD)/obj/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CUDA_CPPFLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/cuda/%.o: kernels/cuda/%.cu $(CU_HDR)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(BUILD)/libmemra.a: $(LIB_OBJ) $(CU_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

define bin_rule
$(BUILD)/bin/$(basename $(notdir $(1))): $(1) $(BUILD)/libmemra.a $(HDRS) $(wildcard kernels/cuda/*.h)
	@mkdir -p $(BUILD)/bin
	$(CC) $(CPPFLAGS) $(CUDA_CPPFLAGS) $(CFLAGS) $(1) -o $$@ $(BUILD)/libmemra.a $(CUDA_LIBS) $(LDLIBS)
endef
$(foreach s,$(BIN_SRC),$(eval $(call bin_rule,$(s))))

# ---- sanitizer objects and unit tests (CPU only) ----
$(BUILD)/asan/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -O1 $(SAN) -c $< -o $@

$(BUILD)/libmemra-asan.a: $(ASAN_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/tests/%: tests/unit/%.c $(wildcard tests/unit/*.h) $(BUILD)/libmemra-asan.a $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -O1 $(SAN) $< -o $@ $(BUILD)/libmemra-asan.a $(CHECK_LIBS) $(LDLIBS)

# ---- libFuzzer targets (clang), over the common/ and proto/ sources and the
# gateway's decoders of outside bytes (not http.c, jobs.c or supervisor.c:
# they need h2o) ----
# The library objects are compiled once with fuzzer instrumentation (no
# libFuzzer main), then each target links them.
FUZZ_LIB_SRC := $(wildcard common/*.c proto/*.c) gateway/openai.c gateway/config.c gateway/auth.c gateway/util.c \
                gateway/textout.c gateway/chatout.c gateway/jsonschema.c gateway/jsonschema_regex.c
FUZZ_LIB_OBJ := $(patsubst %.c,$(BUILD)/fuzzobj/%.o,$(FUZZ_LIB_SRC))
FUZZ_CFLAGS  := $(CSTD) -O1 -g -Wall -Wextra -Werror -Wno-unused-parameter $(PKG_CFLAGS)

$(BUILD)/fuzzobj/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CLANG) $(CPPFLAGS) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link,address,undefined -c $< -o $@

$(BUILD)/fuzz/%: tests/fuzz/%.c $(FUZZ_LIB_OBJ) $(HDRS)
	@mkdir -p $(dir $@)
	$(CLANG) $(CPPFLAGS) $(FUZZ_CFLAGS) -fsanitize=fuzzer,address,undefined $< $(FUZZ_LIB_OBJ) -o $@ $(LDLIBS)
.SECONDARY: $(FUZZ_LIB_OBJ)
