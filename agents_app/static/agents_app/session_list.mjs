// The sessions list (/sessions/): filtering, sorting and paging happen on the server; this
// module only shows the server's UTC times in the viewer's time zone.

import { localizeTimes } from "./dom.mjs";

localizeTimes(document);
