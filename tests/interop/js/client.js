// One MQTT.js client, driven line by line for tests/interop/test_mqttjs.py.
//
// Reads commands, one JSON object a line, on stdin; writes each command's
// answer, one JSON object a line, on stdout. The commands and answers are
// those of driver.js (and tests/interop/remote.py; the aiomqtt driver speaks
// the same); `connect` names the broker's `port` and, for TLS, the `ca` file
// to trust. Whenever a message arrives it writes
//
//   {"event": "message", "topic": "t/a", "payload": "x", "qos": 1, "retain": false}
//
// The test ends the process by closing stdin, or kills it (SIGKILL) to close
// the connection abruptly.
"use strict";

const fs = require("node:fs");
const readline = require("node:readline");
const mqtt = require("mqtt");
const makeDriver = require("./driver.js");

function emit(event) {
  process.stdout.write(JSON.stringify(event) + "\n");
}

function locate(command) {
  if (command.ca === null) return { url: `mqtt://127.0.0.1:${command.port}`, options: {} };
  return {
    url: `mqtts://127.0.0.1:${command.port}`,
    options: { ca: fs.readFileSync(command.ca), rejectUnauthorized: true },
  };
}

const driver = makeDriver(mqtt, locate, (message) => emit({ event: "message", ...message }));

// Commands are answered in the order they came, each after the one before it.
let previous = Promise.resolve();
const lines = readline.createInterface({ input: process.stdin });
lines.on("line", (line) => {
  if (!line.trim()) return;
  const command = JSON.parse(line);
  previous = previous.then(() => driver.handle(command)).then(emit);
});
lines.on("close", () => {
  driver.close();
  process.exit(0);
});
