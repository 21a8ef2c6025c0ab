// Preloaded into the peer (node --import): cross-claude-mcp's HTTP mode listens on 0.0.0.0;
// this makes every listen() of the process bind 127.0.0.1 instead, so the unmodified peer is
// reachable from this machine only.
import net from "node:net";

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (typeof args[0] === "number" || typeof args[0] === "string") {
    if (typeof args[1] === "string") args[1] = "127.0.0.1";
    else args.splice(1, 0, "127.0.0.1");
  } else if (args[0] && typeof args[0] === "object" && !Array.isArray(args[0])) {
    args[0] = { ...args[0], host: "127.0.0.1" };
  }
  return listen.apply(this, args);
};
