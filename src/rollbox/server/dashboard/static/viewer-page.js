// `rollbox view`'s page: the token arrives in the URL's fragment (which no browser sends to a server, so it
// never lands in a log), moves to sessionStorage, and goes to the server as a bearer header.

import { byId, setText } from "./dom.js";
import { Viewer } from "./viewer.js";

const TOKEN_KEY = "rollbox-view-token";
const fragment = new URLSearchParams(window.location.hash.slice(1));
if (fragment.get("token")) {
  sessionStorage.setItem(TOKEN_KEY, fragment.get("token"));
  history.replaceState(null, "", window.location.pathname);
}

async function main() {
  const answer = await fetch("/viewer/api/run", {
    headers: { Authorization: `Bearer ${sessionStorage.getItem(TOKEN_KEY) ?? ""}` }, cache: "no-store",
  });
  if (!answer.ok) {
    setText(byId("viewer-error"), answer.status === 401
      ? "this page needs the link rollbox view printed (with its #token=...)" : `the run could not be read (${answer.status})`);
    return;
  }
  const name = answer.headers.get("x-run-name") ?? "trajectories.jsonl";
  setText(byId("run-name"), name);
  new Viewer(byId("viewer")).load(await answer.text(), name);
}

main();
