// Fault injection for crash tests. With LOOM_FAULT=<point>:<n> in the environment, the n-th
// time the process passes loom_fault_point("<point>") it kills itself with SIGKILL, as a crash
// or `kill -9` would; with LOOM_FAULT=<point>:<n>:parent it kills its parent instead (the
// launcher, as when mpirun is killed under a running job), waits until it is gone, and goes on;
// with LOOM_FAULT=<point>:<n>:hang it stops there until a signal ends it (a hung rank, for the
// watchdog of `loom launch`).
// Points: "step" (after an optimizer step, before any checkpoint of that step), "save-write"
// (before each write into a file being saved atomically).
#pragma once

void loom_fault_point(const char *point);
