# The fuzz targets' committed inputs (seeds and regressions) replayed in the ordinary build,
# without libFuzzer or the sanitizers (tests/fuzz/README.md; scripts/fuzz.sh fuzzes them with both).
foreach(name shard llmc_model ckpt_meta ckpt_state tokenizer_bytes tokenizer_jsonl flags)
  loom_test(fuzz_replay_${name}
            SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_${name}.c ${CMAKE_CURRENT_LIST_DIR}/replay.c
            ARGS ${CMAKE_CURRENT_LIST_DIR}/corpus/${name} ${CMAKE_CURRENT_LIST_DIR}/regressions/${name})
endforeach()
