// The loom subcommands. Each takes argv with argv[0] = the subcommand name and returns the
// process exit code (0 on success; 1 after printing a one-line error).
#pragma once

int loom_cmd_tokenize(int argc, char **argv); // text/JSONL -> token shards (cmd_tokenize.c)
int loom_cmd_encode(int argc, char **argv);   // text -> GPT-2 token ids (cmd_tokenize.c)
int loom_cmd_decode(int argc, char **argv);   // token ids -> text (cmd_tokenize.c)
int loom_cmd_train(int argc, char **argv);    // train a model (cmd_train.c)
int loom_cmd_eval(int argc, char **argv);     // validation loss of a model file (cmd_eval.c)
int loom_cmd_sample(int argc, char **argv);   // generate text (cmd_sample.c)
int loom_cmd_bench(int argc, char **argv);    // timed training steps (cmd_bench.c)
int loom_cmd_bench_comm(int argc, char **argv); // collective bandwidth (cmd_bench_comm.c)
int loom_cmd_schedule(int argc, char **argv);   // pipeline schedule timeline (cmd_schedule.c)
int loom_cmd_plot(int argc, char **argv);       // a metrics file's curves with gnuplot (cmd_plot.c)
int loom_cmd_launch(int argc, char **argv);     // run a job, restart it on failure (cmd_launch.c)
int loom_cmd_export(int argc, char **argv);     // a model file as a Hugging Face folder (cmd_export.c)
