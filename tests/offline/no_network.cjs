// The network switched off for a Node.js program (mystmd, which builds the course website):
// NODE_OPTIONS="--require tests/offline/no_network.cjs". The same rule as sitecustomize.py
// beside it: loopback and local (Unix) sockets stay open, any other connection or name lookup
// fails with an error, and is appended to the file named by COURSE_NETWORK_LOG.
"use strict";
const dns = require("dns");
const fs = require("fs");
const net = require("net");

const LOCAL = /^(localhost|127\.\d+\.\d+\.\d+|::1|::ffff:127\.\d+\.\d+\.\d+|0\.0\.0\.0|::)$/i;

function refuse(what) {
  const log = process.env.COURSE_NETWORK_LOG;
  if (log) fs.appendFileSync(log, `node pid ${process.pid}: ${what}\n${new Error().stack}\n\n`);
  const error = new Error(`the network is switched off in this run (tests/offline): ${what}`);
  error.code = "ENETUNREACH";
  return error;
}

// Where a call to socket.connect(...) goes: options object, [options, callback], or (port, host).
function target(args) {
  let first = args[0];
  if (Array.isArray(first)) first = first[0];
  if (first && typeof first === "object") return first.path ? null : String(first.host || "localhost");
  if (typeof first === "string" && Number.isNaN(Number(first))) return null;  // a Unix socket path
  return typeof args[1] === "string" ? args[1] : "localhost";
}

const connect = net.Socket.prototype.connect;
net.Socket.prototype.connect = function (...args) {
  const host = target(args);
  if (host !== null && !LOCAL.test(host.replace(/^\[|\]$/g, ""))) {
    const error = refuse(`connect to ${host}`);
    process.nextTick(() => this.destroy(error));
    return this;
  }
  return connect.apply(this, args);
};

for (const api of [dns, dns.promises]) {
  const lookup = api.lookup;
  api.lookup = function (hostname, ...rest) {
    // An address written in digits needs no lookup (a server listening on this machine's address).
    if (LOCAL.test(String(hostname)) || net.isIP(String(hostname))) return lookup.call(this, hostname, ...rest);
    const error = refuse(`name lookup of ${hostname}`);
    if (api === dns.promises) return Promise.reject(error);
    const callback = rest[rest.length - 1];
    process.nextTick(() => callback(error));
    return undefined;
  };
}
