// iomatrix pages embed plotly.js and their data gzip+base64 (half their size inline) and unpack
// them with the browser's DecompressionStream before drawing.
const bytesOf = (id) => {
  const raw = atob(document.getElementById(id).textContent.trim());
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  return bytes;
};
const unpack = (id) => new Response(new Blob([bytesOf(id)]).stream()
  .pipeThrough(new DecompressionStream("gzip"))).text();
// plotly.js loaded (as global code: it defines window.Plotly as its own <script> would), and the
// text of the packed element `dataId`.
async function withPlotly(dataId) {
  if (typeof DecompressionStream !== "function") {
    throw new Error("this browser cannot decompress the page's data (no DecompressionStream): "
                    + "open it in a current Chromium, Firefox or Safari");
  }
  const [dataText, plotlyText] = await Promise.all([unpack(dataId), unpack("plotly-js")]);
  (0, eval)(plotlyText);
  return dataText;
}
