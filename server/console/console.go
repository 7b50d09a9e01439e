// Package console is Berth's web console: a page, a script and a style
// sheet embedded in the binary, served under /ui/ on the admin HTTP port.
// It loads nothing from anywhere else, so it works with no network. The
// page polls the admin JSON (/v1/status, /v1/info, /v1/queues/stats,
// /v1/connections) and posts actions (/v1/queues/declare, /purge,
// /delete) with the X-Berth-Action header the server requires; the
// server side is server/admin_console.go.
package console

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed assets
var assets embed.FS

// files is the assets directory as the root.
var files = func() fs.FS {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err)
	}
	return sub
}()

// contentSecurityPolicy allows the page's own script, style and API
// calls, nothing inline and nothing from elsewhere.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the console's files, with the console at "/": mount it
// under a prefix with http.StripPrefix. Only GET and HEAD are answered.
func Handler() http.Handler {
	fileServer := http.FileServerFS(files)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, r.Method+": the console's files take GET", http.StatusMethodNotAllowed)
			return
		}
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		// Embedded files carry no modification time: revalidation cannot
		// work, so the browser is told to fetch again, which is cheap.
		h.Set("Cache-Control", "no-cache")
		fileServer.ServeHTTP(w, r)
	})
}
