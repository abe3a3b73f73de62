"""OpenAI chat completions and completions: protocol, serving (the generation path the
other generating APIs run through too), routes; tools, structured outputs, reasoning."""
