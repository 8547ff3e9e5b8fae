// One MQTT.js client in a browser page, for tests/interop/test_browser.py.
//
// The page loads MQTT.js's browser bundle (mqtt.min.js, the global `mqtt`),
// driver.js (the command handling the Node driver shares, `makeDriver`) and
// this file, which defines `driver`. The test calls, through Playwright's
// page.evaluate:
//
//   driver.handle(command)  a Promise of the command's answer (driver.js)
//   driver.drain()          the messages received since the last drain
//
// `connect` names the WebSocket URL to use (`url`) instead of a port and a CA
// file: a page trusts what its browser trusts. Messages are kept as
// {"topic", "payload", "qos", "retain"} until drained.
"use strict";

const driver = (() => {
  const received = [];
  const shared = makeDriver(mqtt, (command) => ({ url: command.url, options: {} }), (message) =>
    received.push(message),
  );

  function drain() {
    return received.splice(0, received.length);
  }

  return { handle: shared.handle, drain };
})();
