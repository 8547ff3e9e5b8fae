// One MQTT.js client, driven line by line for tests/interop/test_mqttjs.py.
//
// Reads commands, one JSON object a line, on stdin; writes events, one JSON
// object a line, on stdout. The commands and events are those of
// tests/interop/remote.py (the aiomqtt driver speaks the same):
//
//   {"op": "connect", "port": 1883, "clientId": "a", "version": 5, "clean": true,
//    "expiry": null, "username": null, "password": null, "ca": null, "will": null}
//        -> {"event": "connack", "sessionPresent": false}
//           or {"event": "refused", "code": 134}
//   {"op": "subscribe", "filter": "t/#", "qos": 1}   -> {"event": "suback", "codes": [1]}
//   {"op": "publish", "topic": "t/a", "payload": "x", "qos": 1, "retain": false}
//        -> {"event": "published"}   (after the PUBACK / PUBCOMP)
//   {"op": "disconnect"}                              -> {"event": "disconnected"}
//   and, whenever one arrives:
//        {"event": "message", "topic": "t/a", "payload": "x", "qos": 1, "retain": false}
//
// A failure is {"event": "error", "message": "..."}. The test ends the process
// by closing stdin, or kills it (SIGKILL) to close the connection abruptly.
"use strict";

const fs = require("node:fs");
const readline = require("node:readline");
const mqtt = require("mqtt");

let client = null;

function emit(event) {
  process.stdout.write(JSON.stringify(event) + "\n");
}

function connect(command) {
  const options = {
    clientId: command.clientId,
    protocolVersion: command.version,
    clean: command.clean,
    reconnectPeriod: 0, // the test decides when to connect again
    connectTimeout: 30_000,
    keepalive: 60,
  };
  if (command.version === 5 && command.expiry !== null) {
    options.properties = { sessionExpiryInterval: command.expiry };
  }
  if (command.username !== null) options.username = command.username;
  if (command.password !== null) options.password = command.password;
  if (command.will !== null) {
    options.will = {
      topic: command.will.topic,
      payload: Buffer.from(command.will.payload),
      qos: command.will.qos,
      retain: false,
    };
  }
  const scheme = command.ca === null ? "mqtt" : "mqtts";
  if (command.ca !== null) {
    options.ca = fs.readFileSync(command.ca);
    options.rejectUnauthorized = true;
  }
  client = mqtt.connect(`${scheme}://127.0.0.1:${command.port}`, options);
  client.once("connect", (connack) => {
    emit({ event: "connack", sessionPresent: Boolean(connack.sessionPresent) });
  });
  client.on("error", (error) => {
    // A refused CONNECT: MQTT 5 reason code or MQTT 3.1.1 return code.
    if (typeof error.code === "number") emit({ event: "refused", code: error.code });
    else emit({ event: "error", message: String(error.message || error) });
  });
  client.on("message", (topic, payload, packet) => {
    emit({
      event: "message",
      topic,
      payload: payload.toString("utf8"),
      qos: packet.qos,
      retain: Boolean(packet.retain),
    });
  });
}

function handle(command) {
  switch (command.op) {
    case "connect":
      connect(command);
      break;
    case "subscribe":
      client.subscribe(command.filter, { qos: command.qos }, (error, granted) => {
        if (error) emit({ event: "error", message: String(error.message || error) });
        else emit({ event: "suback", codes: granted.map((g) => g.qos) });
      });
      break;
    case "publish":
      client.publish(
        command.topic,
        Buffer.from(command.payload),
        { qos: command.qos, retain: command.retain },
        (error) => {
          if (error) emit({ event: "error", message: String(error.message || error) });
          else emit({ event: "published" });
        },
      );
      break;
    case "disconnect":
      client.end(false, {}, () => emit({ event: "disconnected" }));
      break;
    default:
      emit({ event: "error", message: `unknown op ${JSON.stringify(command.op)}` });
  }
}

const lines = readline.createInterface({ input: process.stdin });
lines.on("line", (line) => {
  if (line.trim()) handle(JSON.parse(line));
});
lines.on("close", () => {
  if (client !== null && client.connected) client.end(true);
  process.exit(0);
});
