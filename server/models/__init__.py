"""The models this server offers (catalog: names, resolution, listing) and which of them
are loaded (residency: loading, LRU, memory budget, idle reaping), each loaded model
with its worker thread."""
