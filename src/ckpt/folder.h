// A run's checkpoint folder (--ckpt-dir) as a whole: made when missing, held by one run at a
// time, and cleaned of what an interrupted save left behind (ckpt/checkpoint.h names the files).
//
// The lock is DIR/loom.lock, locked with flock(2) while the run lasts (the kernel releases it
// when the process dies, so a killed run leaves no stale lock) and holding one line that names
// its holder (pid, host, start time) for the message another run prints. Making it is also where
// the folder's write access is checked, before any training step.
#pragma once
#include "core/status.h"

typedef struct loom_ckpt_lock loom_ckpt_lock;

// Creates `dir` when missing and takes its lock. Errors: LOOM_EIO when dir cannot be created, is
// not a folder, or is not writable; LOOM_EINVAL naming the holder when another run holds it.
loom_status loom_ckpt_lock_take(const char *dir, loom_ckpt_lock **out);
// Removes the lock file and releases the lock (NULL: nothing).
void loom_ckpt_lock_release(loom_ckpt_lock *lock);

// With the lock held: removes the leftovers of interrupted saves — temporaries of checkpoint
// files (NAME.tmp.PID) and the model and optimizer state files of steps without metadata (a
// save that did not complete). *removed counts them. Errors: LOOM_EIO naming the folder or the
// file that could not be removed.
loom_status loom_ckpt_clean(const char *dir, int *removed);
