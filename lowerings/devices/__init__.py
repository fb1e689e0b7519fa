"""One module per device: every family's lowerings there, ranked, and the rules that say when each is correct
(`supports`) and when AUTO prefers it (`prefer`). A new device is one module here plus one `register_backend` call."""
