-- truthput results store, schema version 1.
-- One row per thing that happened; figures derived from raw data (scrapes, requests, logs) are
-- kept in trials.results_json so that `truthput report` can recompute or re-read them.
PRAGMA journal_mode = WAL;

CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);

CREATE TABLE IF NOT EXISTS runs (
  id TEXT PRIMARY KEY,               -- e.g. 20261130-101500-quickstart-3f2a
  name TEXT NOT NULL,
  created_at TEXT NOT NULL,          -- ISO 8601 UTC
  finished_at TEXT,
  status TEXT NOT NULL,              -- running | done | interrupted | failed
  engine TEXT NOT NULL,              -- sim | vllm | command | external | systemd
  simulated INTEGER NOT NULL DEFAULT 0,
  experiment_path TEXT,
  experiment_toml TEXT NOT NULL,     -- the file as read, byte for byte
  seed INTEGER,
  machine_json TEXT NOT NULL,        -- host, cpu, python, truthput version + git commit, GPUs
  summary_json TEXT                  -- verdict etc., written at the end
);

CREATE TABLE IF NOT EXISTS variants (
  run_id TEXT NOT NULL REFERENCES runs(id),
  name TEXT NOT NULL,
  position INTEGER NOT NULL,
  is_baseline INTEGER NOT NULL DEFAULT 0,
  argv_json TEXT NOT NULL,           -- the exact argv launched (host/port filled in at start)
  diff_json TEXT NOT NULL,           -- flags added / changed / removed vs the baseline
  env_json TEXT NOT NULL,
  PRIMARY KEY (run_id, name)
);

CREATE TABLE IF NOT EXISTS starts (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  run_id TEXT NOT NULL REFERENCES runs(id),
  variant TEXT NOT NULL,
  start_index INTEGER NOT NULL,      -- replication index of the server start for this variant
  status TEXT NOT NULL,              -- starting | ready | failed | stopped
  argv_json TEXT,
  port INTEGER,
  pid INTEGER,
  started_at REAL,                   -- wall clock (epoch s)
  ready_s REAL,                      -- seconds from spawn to ready
  stopped_at REAL,
  failure_class TEXT,                -- oom | kv_too_small | invalid_config | port_in_use | startup_timeout | crash_under_load | request_errors | exited
  failure_reason TEXT,
  failure_line TEXT,
  log_excerpt TEXT,
  engine_version TEXT,
  info_json TEXT                     -- telemetry summary, restart count, anything engine-specific
);

CREATE TABLE IF NOT EXISTS trials (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  run_id TEXT NOT NULL REFERENCES runs(id),
  variant TEXT NOT NULL,
  start_id INTEGER REFERENCES starts(id),
  start_index INTEGER NOT NULL,
  concurrency INTEGER NOT NULL,      -- closed loop: streams (0 for an open loop)
  rate REAL NOT NULL DEFAULT 0,      -- open loop: requests/s offered (0 for a closed loop)
  trial_index INTEGER NOT NULL,
  status TEXT NOT NULL,              -- ok | failed
  t0_wall REAL NOT NULL,             -- epoch seconds at t0_mono
  t0_mono REAL NOT NULL,             -- time.monotonic() at the trial's start (all *_mono are this clock)
  window_start REAL,                 -- monotonic: all N streams in flight
  window_end REAL,
  t_end REAL,                        -- monotonic: after the drain
  results_json TEXT NOT NULL,        -- every figure with its provenance (see truthput.measure)
  error TEXT,
  UNIQUE (run_id, variant, start_index, concurrency, rate, trial_index)
);

CREATE TABLE IF NOT EXISTS requests (
  trial_id INTEGER NOT NULL REFERENCES trials(id),
  idx INTEGER NOT NULL,
  t_start REAL NOT NULL,
  t_first REAL,
  t_end REAL,
  status TEXT NOT NULL,
  http_status INTEGER,
  error TEXT,
  prompt_tokens INTEGER,
  completion_tokens INTEGER,
  finish_reason TEXT,
  n_chunks INTEGER NOT NULL,
  chunks_json TEXT NOT NULL,         -- {"t": [...], "running": [...], "text": [...]} (older: [[t, running, text], ...]); read with store.db.decode_chunks
  PRIMARY KEY (trial_id, idx)
);

CREATE TABLE IF NOT EXISTS scrapes (
  trial_id INTEGER NOT NULL REFERENCES trials(id),
  phase TEXT NOT NULL,               -- pre | window_start | window_end | post | periodic
  t_mono REAL NOT NULL,
  text TEXT,                         -- raw Prometheus exposition text as served
  error TEXT
);

CREATE TABLE IF NOT EXISTS server_logs (
  start_id INTEGER NOT NULL REFERENCES starts(id),
  seq INTEGER NOT NULL,
  t_mono REAL NOT NULL,
  stream TEXT NOT NULL,              -- stdout | stderr | journal
  line TEXT NOT NULL,
  PRIMARY KEY (start_id, seq)
);

CREATE TABLE IF NOT EXISTS events (
  run_id TEXT NOT NULL,
  t_wall REAL NOT NULL,
  kind TEXT NOT NULL,
  message TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS telemetry (
  trial_id INTEGER NOT NULL REFERENCES trials(id),
  t_mono REAL NOT NULL,
  gpu INTEGER NOT NULL,
  util_pct REAL, mem_used_bytes REAL, power_w REAL, sm_clock_mhz REAL
);

CREATE INDEX IF NOT EXISTS trials_by_run ON trials(run_id, variant, concurrency);
CREATE INDEX IF NOT EXISTS scrapes_by_trial ON scrapes(trial_id);
