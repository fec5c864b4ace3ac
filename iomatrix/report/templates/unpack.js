// iomatrix pages embed plotly.js and their data gzip+base85 (half their size inline) and unpack
// them with the browser's DecompressionStream before drawing.
// Base85 as Python's b85encode writes it (RFC 1924's alphabet), with "." for "<" (html.packed):
// each 5 characters are 4 bytes, big-endian; a last group of n characters is n - 1 bytes,
// completed with the highest digit as the encoder's zero bytes were cut off.
const B85 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~";
const bytesOf = (id) => {
  const text = document.getElementById(id).textContent.trim();
  const digit = new Uint8Array(128);
  for (let i = 0; i < B85.length; i++) digit[B85.charCodeAt(i)] = i;
  digit[".".charCodeAt(0)] = digit["<".charCodeAt(0)];
  const n = text.length;
  const rest = n % 5;
  const bytes = new Uint8Array(Math.floor(n / 5) * 4 + Math.max(0, rest - 1));
  for (let i = 0, o = 0; i < n; i += 5, o += 4) {
    let v = 0;   // below 2**32 (85**5 > 2**32: no bitwise arithmetic until it is whole)
    for (let j = i; j < i + 5; j++) v = v * 85 + (j < n ? digit[text.charCodeAt(j)] : 84);
    const last = Math.min(4, bytes.length - o);
    for (let k = 0; k < last; k++) bytes[o + k] = (v >>> (24 - 8 * k)) & 255;
  }
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
