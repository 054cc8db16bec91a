"""The GPU driver's parts (`scripts/gpu/run.py` is the driver): `config` (paths, fixed settings
and what the run decided), `runner` (commands: limited, measured, or shown in a dry run), `record`
(the summary and what is read from logs), `nccl` (NCCL under Socket or the plugin, as two hosts
or on one machine's GPUs), `verdict` (each performance target judged from the targets stage's
logs), and the stages by kind: `build`, `collectives`, `torchruns`, `hosts`, `ucx`, `fabtests`.
Each module imports only those before it in this list."""
