// One MQTT.js client in a browser page, for tests/interop/test_browser.py.
//
// The page loads MQTT.js's browser bundle (mqtt.min.js, the global `mqtt`)
// and this file, which defines `driver`. The test calls, through Playwright's
// page.evaluate:
//
//   driver.handle(command)  a Promise of the command's answer
//   driver.drain()          the messages received since the last drain
//
// The commands and answers are those of tests/interop/remote.py (the Node
// driver, client.js, speaks them too), except that `connect` names the
// WebSocket URL to use instead of a port and a CA file: a page trusts what
// its browser trusts.
//
//   {"op": "connect", "url": "ws://127.0.0.1:8080/mqtt", "clientId": "a",
//    "version": 5, "clean": true, "expiry": null, "username": null,
//    "password": null, "will": null}
//        -> {"event": "connack", "sessionPresent": false}
//           or {"event": "refused", "code": 134}
//           or {"event": "error", "message": "..."}  (no CONNACK: the
//              WebSocket could not open, or closed before it)
//   {"op": "subscribe", "filter": "t/#", "qos": 1}   -> {"event": "suback", "codes": [1]}
//   {"op": "publish", "topic": "t/a", "payload": "x", "qos": 1, "retain": false}
//        -> {"event": "published"}   (after the PUBACK / PUBCOMP)
//   {"op": "disconnect"}                              -> {"event": "disconnected"}
//
// Messages are kept as {"topic", "payload", "qos", "retain"} until drained.
"use strict";

const driver = (() => {
  const received = [];
  const decoder = new TextDecoder();
  let client = null;

  function describe(error) {
    return String((error && error.message) || error);
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
        payload: command.will.payload,
        qos: command.will.qos,
        retain: false,
      };
    }
    return new Promise((resolve) => {
      client = mqtt.connect(command.url, options);
      client.on("message", (topic, payload, packet) => {
        received.push({
          topic,
          payload: decoder.decode(payload),
          qos: packet.qos,
          retain: Boolean(packet.retain),
        });
      });
      // Whichever comes first answers; the promise ignores the rest.
      client.once("connect", (connack) => {
        resolve({ event: "connack", sessionPresent: Boolean(connack.sessionPresent) });
      });
      client.once("error", (error) => {
        // A refused CONNECT: MQTT 5 reason code or MQTT 3.1.1 return code.
        if (typeof error.code === "number") resolve({ event: "refused", code: error.code });
        else resolve({ event: "error", message: describe(error) });
      });
      client.once("close", () => {
        resolve({ event: "error", message: "the connection closed before a CONNACK" });
      });
    });
  }

  function subscribe(command) {
    return new Promise((resolve) => {
      client.subscribe(command.filter, { qos: command.qos }, (error, granted) => {
        if (error) resolve({ event: "error", message: describe(error) });
        else resolve({ event: "suback", codes: granted.map((g) => g.qos) });
      });
    });
  }

  function publish(command) {
    const options = { qos: command.qos, retain: command.retain };
    return new Promise((resolve) => {
      client.publish(command.topic, command.payload, options, (error) => {
        if (error) resolve({ event: "error", message: describe(error) });
        else resolve({ event: "published" });
      });
    });
  }

  function disconnect() {
    return new Promise((resolve) => {
      client.end(false, {}, () => resolve({ event: "disconnected" }));
    });
  }

  async function handle(command) {
    switch (command.op) {
      case "connect":
        return connect(command);
      case "subscribe":
        return subscribe(command);
      case "publish":
        return publish(command);
      case "disconnect":
        return disconnect();
      default:
        return { event: "error", message: `unknown op ${JSON.stringify(command.op)}` };
    }
  }

  function drain() {
    return received.splice(0, received.length);
  }

  return { handle, drain };
})();
