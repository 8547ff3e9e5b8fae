"""MQTT 5.0 and 3.1.1 for Riverbed.

`riverbed.mqtt.codec` turns bytes into packets and packets into bytes (sans-I/O).
The connection state machine, the broker, authentication and ACLs build on it.
"""
