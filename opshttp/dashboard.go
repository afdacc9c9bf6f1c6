package opshttp

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html"
	"io/fs"
	"net/http"
	"strconv"
	"time"

	"github.com/couchq/couchq/internal/forms"
	"github.com/couchq/couchq/internal/protocol"
)

// The dashboard's page and its assets, served from the binary so that it
// works with no network but the way to couchq. The charts are uPlot
// 1.6.32 (MIT, assets/uPlot.LICENSE), copied from its npm package's dist/
// (npm pack uplot@1.6.32): small, kept up, and no dependencies of its own.
//
//go:embed assets
var assetFiles embed.FS

// Windows the dashboard plots, and the bucket each is plotted in: a few
// hundred points at most, whatever the window.
var seriesWindows = map[string]struct{ window, step time.Duration }{
	"1h":  {time.Hour, time.Minute},
	"24h": {24 * time.Hour, 10 * time.Minute},
	"7d":  {7 * 24 * time.Hour, time.Hour},
}

const (
	// failedLimitDefault and failedLimitMax bound /api/failed?limit.
	failedLimitDefault = 50
	failedLimitMax     = 500
)

// batchesLimit bounds the batches /api/batches lists: unfinished first.
const batchesLimit = 50

// apiBatch is one batch's progress, with its callback's id and status.
func (s *server) apiBatch(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RefreshTimeout)
	defer cancel()
	id := r.PathValue("id")
	rd, code, err := s.readerFor(ctx, r)
	if err != nil {
		refused(w, r, code, err)
		return
	}
	b, err := rd.q.Batch(ctx, id)
	if errors.Is(err, protocol.ErrNotFound) {
		writeAPIError(w, http.StatusNotFound, "no batch "+id)
		return
	}
	if err != nil {
		s.readFailed(w, r, rd, err)
		return
	}
	out := struct {
		*protocol.BatchStatus
		CallbackID     string `json:"callback_id"`
		CallbackStatus string `json:"callback_status,omitempty"`
	}{BatchStatus: b, CallbackID: protocol.BatchCallbackID(id)}
	if b.Callback != nil {
		out.CallbackStatus = string(b.Callback.Status)
	}
	s.writeJSON(w, out)
}

// dashboardRoutes adds the page, its assets and the endpoints it reads
// and acts through.
func (s *server) dashboardRoutes(mux *http.ServeMux) {
	assets, err := fs.Sub(assetFiles, "assets")
	if err != nil {
		// fs.Sub fails only on an invalid path; "assets" is a constant.
		panic(err)
	}
	mux.Handle("GET /assets/", http.StripPrefix("/assets/", http.FileServerFS(assets)))
	mux.HandleFunc("GET /{$}", s.page)
	mux.HandleFunc("GET /api/queues", s.cached(func(ctx context.Context, q *protocol.Client, _ *http.Request) (any, error) {
		return q.Queues(ctx)
	}))
	mux.HandleFunc("GET /api/workers", s.cached(func(ctx context.Context, q *protocol.Client, _ *http.Request) (any, error) {
		return q.WorkersNow(ctx)
	}))
	mux.HandleFunc("GET /api/batches", s.cached(func(ctx context.Context, q *protocol.Client, _ *http.Request) (any, error) {
		return q.Batches(ctx, batchesLimit)
	}))
	mux.HandleFunc("GET /api/batches/{id}", s.apiBatch)
	mux.HandleFunc("GET /api/series", s.apiSeries)
	mux.HandleFunc("GET /api/failed", s.apiFailed)
	// Actions change the queue: a page of another site must not make the
	// browser post them with credentials it holds for this one.
	protect := http.NewCrossOriginProtection()
	mux.Handle("POST /api/jobs/{id}/retry", protect.Handler(s.action(s.retry)))
	mux.Handle("POST /api/jobs/{id}/cancel", protect.Handler(s.action(s.cancelJob)))
	mux.Handle("POST /api/types/{type}/pause", protect.Handler(s.action(s.pause)))
	mux.Handle("POST /api/types/{type}/resume", protect.Handler(s.action(s.resume)))
	// Agents (agents.go): scripts and tools, not browsers, but a browser
	// holding credentials must not be made to post them either.
	mux.Handle("POST /api/claim", protect.Handler(s.actionAs(s.agentClaim)))
	mux.Handle("POST /api/jobs/{id}/complete", protect.Handler(s.actionAs(s.agentComplete)))
	mux.Handle("POST /api/jobs/{id}/fail", protect.Handler(s.actionAs(s.agentFail)))
	mux.Handle("POST /api/jobs/{id}/extend", protect.Handler(s.actionAs(s.agentExtend)))
	mux.Handle("POST /api/jobs/{id}/progress", protect.Handler(s.actionAs(s.agentProgress)))
	mux.Handle("POST /api/jobs/{id}/release", protect.Handler(s.actionAs(s.agentRelease)))
}

func (s *server) page(w http.ResponseWriter, r *http.Request) {
	body, err := assetFiles.ReadFile("assets/index.html")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	// The page runs only its own scripts, and talks only to couchq.
	w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'")
	_, _ = w.Write(bytes.ReplaceAll(body, []byte("{{DB}}"), []byte(html.EscapeString(s.db))))
}

func (s *server) apiSeries(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("window")
	if name == "" {
		name = "1h"
	}
	win, ok := seriesWindows[name]
	if !ok {
		writeAPIError(w, http.StatusBadRequest, fmt.Sprintf("invalid window %q: want 1h, 24h or 7d", name))
		return
	}
	s.cached(func(ctx context.Context, q *protocol.Client, r *http.Request) (any, error) {
		return q.Series(ctx, protocol.SeriesOptions{
			Worker: r.URL.Query().Get("type"), Until: s.cfg.Now(), Window: win.window, Step: win.step,
		})
	})(w, r)
}

func (s *server) apiFailed(w http.ResponseWriter, r *http.Request) {
	limit := failedLimitDefault
	if l := r.URL.Query().Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > failedLimitMax {
			writeAPIError(w, http.StatusBadRequest, fmt.Sprintf("invalid limit %q: want a number from 1 to %d", l, failedLimitMax))
			return
		}
		limit = n
	}
	s.cached(func(ctx context.Context, q *protocol.Client, r *http.Request) (any, error) {
		var types []string
		if t := r.URL.Query().Get("type"); t != "" {
			types = []string{t}
		} else {
			// Only the types that have failed jobs: one range each.
			queues, err := q.Queues(ctx)
			if err != nil {
				return nil, err
			}
			types = []string{}
			for _, q := range queues {
				if q.Failed > 0 {
					types = append(types, q.Type)
				}
			}
		}
		items, err := q.RecentFailed(ctx, types, limit)
		if err != nil {
			return nil, err
		}
		jobs := make([]any, len(items))
		for i, it := range items {
			jobs[i] = it
		}
		return s.hidePayloads(jobs)
	})(w, r)
}

// cached answers a GET with compute's value as JSON, read by the
// request's reader (readerFor) and reused for CacheTTL by every request
// with the same path and query and, with ReadAuth, the same user.
func (s *server) cached(compute func(ctx context.Context, q *protocol.Client, r *http.Request) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		loginCtx, cancel := context.WithTimeout(r.Context(), s.cfg.RefreshTimeout)
		rd, code, err := s.readerFor(loginCtx, r)
		cancel()
		if err != nil {
			refused(w, r, code, err)
			return
		}
		body, err := s.cache.get(rd.cacheKey(r), func() ([]byte, error) {
			// Others may wait for this answer: one client going away
			// must not fail theirs.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), s.cfg.RefreshTimeout)
			defer cancel()
			v, err := compute(ctx, rd.q, r)
			if err != nil {
				return nil, err
			}
			var buf bytes.Buffer
			err = forms.WriteJSON(&buf, v)
			return buf.Bytes(), err
		})
		if err != nil {
			s.readFailed(w, r, rd, err)
			return
		}
		writeAPIBody(w, http.StatusOK, body)
	}
}

// invalidate drops the cached answers after an action.
func (s *server) invalidate() {
	s.cache.clear()
}

// writeJSON answers 200 with v.
func (s *server) writeJSON(w http.ResponseWriter, v any) {
	s.writeJSONStatus(w, http.StatusOK, v)
}

func (s *server) writeJSONStatus(w http.ResponseWriter, code int, v any) {
	var buf bytes.Buffer
	if err := forms.WriteJSON(&buf, v); err != nil {
		s.serverFailed(w, err)
		return
	}
	writeAPIBody(w, code, buf.Bytes())
}
