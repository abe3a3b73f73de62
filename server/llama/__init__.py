"""llama-server's own endpoints: /completion, /infill, /apply-template and /props."""
