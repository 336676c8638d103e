"""The contract every part of the house shares, and the floor below all of them.

It imports nothing of the project and no torch: `errors` (the one-line user error), `hooks`
(the plugin hook points, plugin configs and the set the trainer calls), `events` (the typed
contexts the hooks receive). The trainer and every plugin import these modules; the config
machinery composes the plugins' configs above them.
"""
