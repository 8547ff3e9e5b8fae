// The command handling both MQTT.js drivers share: client.js (Node, over TCP
// and TLS) and page.js (a browser page, over WebSockets). Loaded with
// `require` in Node and with a <script> tag in the page, where it defines the
// global `makeDriver`.
//
// The commands and answers are those of tests/interop/remote.py:
//
//   {"op": "connect", "clientId": "a", "version": 5, "clean": true,
//    "expiry": null, "username": null, "password": null, "will": null, ...}
//        -> {"event": "connack", "sessionPresent": false}
//           or {"event": "refused", "code": 134}
//           or {"event": "error", "message": "..."}  (no CONNACK: the
//              connection could not open, or closed before it)
//   {"op": "subscribe", "filter": "t/#", "qos": 1}   -> {"event": "suback", "codes": [1]}
//   {"op": "publish", "topic": "t/a", "payload": "x", "qos": 1, "retain": false}
//        -> {"event": "published"}   (after the PUBACK / PUBCOMP)
//   {"op": "disconnect"}                              -> {"event": "disconnected"}
//
// Where to connect is the caller's: `locate(command)` gives the URL and any
// options of its own (a CA file in Node); each message received goes to
// `onMessage({topic, payload, qos, retain})`.
(function (root, factory) {
  if (typeof module === "object" && module.exports) module.exports = factory();
  else root.makeDriver = factory();
})(typeof self !== "undefined" ? self : this, () => {
  "use strict";

  function describe(error) {
    return String((error && error.message) || error);
  }

  function clientOptions(command) {
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
    return options;
  }

  return function makeDriver(mqtt, locate, onMessage) {
    const decoder = new TextDecoder();
    let client = null;

    function connect(command) {
      const { url, options } = locate(command);
      return new Promise((resolve) => {
        client = mqtt.connect(url, { ...clientOptions(command), ...options });
        client.on("message", (topic, payload, packet) => {
          onMessage({
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

    function close() {
      if (client !== null && client.connected) client.end(true);
    }

    return { handle, close };
  };
});
