"""The nemesis: a seeded, randomized fault runner with a recorded history and a checker."""
