"""The trial pipeline, shared by `truthput run` (which also owns server lifecycles) and
`truthput load` (a server someone else runs): scrapes, window, in-window samples, settle,
measure, the failure rule, commit."""
