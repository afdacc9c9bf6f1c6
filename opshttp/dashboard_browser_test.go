package opshttp

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/go-kivik/kivik/v4"

	"github.com/couchq/couchq/internal/opstest"
	"github.com/couchq/couchq/internal/protocol"
)

// screenshotEnv names a file the browser test also writes its screenshot
// to: how the README's docs/dashboard.png is made.
const screenshotEnv = "COUCHQ_SCREENSHOT"

// findBrowser is the path of a Chromium or Chrome on PATH, or "".
func findBrowser() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// needBrowser is findBrowser's browser; the test is skipped without one.
func needBrowser(t *testing.T) string {
	t.Helper()
	browser := findBrowser()
	if browser == "" {
		t.Skip("no chromium, chromium-browser or google-chrome on PATH: the browser test needs one (make setup installs Debian's chromium when it can)")
	}
	return browser
}

// openBrowser starts the browser at path (findBrowser) for the test, with
// extra options, and returns its context; it is closed when the test ends.
func openBrowser(ctx context.Context, t *testing.T, path string, extra ...chromedp.ExecAllocatorOption) context.Context {
	opts := append(append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // tests run as root in containers
		chromedp.Flag("disable-dev-shm-usage", true),
	), extra...)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	bctx, cancelBrowser := chromedp.NewContext(allocCtx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() {
		cancelBrowser()
		cancelAlloc()
	})
	return bctx
}

// The dashboard in a real browser, against a real server with jobs in
// every state and an hour of activity behind them: the page loads, the
// plots have points, the per-type table and the failed job show, and a
// retry from the page (logged in as a CouchDB admin) puts the job back in
// the queue. The screenshot is saved under the test's temp dir (and to
// $COUCHQ_SCREENSHOT when set).
func TestDashboardInABrowser(t *testing.T) {
	t.Parallel()
	browser := needBrowser(t)
	admin, password := srv.Credentials()
	if admin == "" {
		t.Skip("the test server authenticates no users: the page's actions cannot log in")
	}
	ctx, db := newDB(t)
	q, err := protocol.New(ctx, db, protocol.Config{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	simulateHour(ctx, t, db, now)
	failedID := seedEveryState(ctx, t, q, now)
	hs := serveHandler(ctx, t, q, Config{CouchURL: srv.URL(), CacheTTL: -1})

	bctx, cancel := context.WithTimeout(openBrowser(ctx, t, browser, chromedp.WindowSize(1400, 1000)), 3*time.Minute)
	defer cancel()

	plotted := `document.body.dataset.loaded === '1' && document.querySelectorAll('.chart canvas').length >= 4 &&
		['chart-throughput', 'chart-failures', 'chart-depth', 'chart-timings']
			.every(function (id) { return +document.getElementById(id).dataset.points > 0; })`
	css := func(sel string) chromedp.CSS { return chromedp.CSS(sel) }
	text := func(sel string) string {
		v, err := chromedp.Run(bctx, chromedp.Text(css(sel)))
		if err != nil {
			t.Fatalf("reading %s: %v", sel, err)
		}
		return v
	}
	err = chromedp.Do(bctx,
		chromedp.Navigate(hs.URL+"/"),
		chromedp.Poll[chromedp.Void](plotted, chromedp.WithPollingTimeout(time.Minute)),
		// Polled, not waited for as visible: the page replaces its rows on
		// every refresh, and a row found before one never shows.
		chromedp.Poll[chromedp.Void](`document.querySelector('#failed tr[data-job=`+jsString(failedID)+`]') !== null &&
			document.querySelector('#workers tbody tr:nth-child(2)') !== null`, chromedp.WithPollingTimeout(time.Minute)),
	)
	if err != nil {
		t.Fatalf("loading the dashboard: %v", err)
	}
	shot, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("taking a screenshot: %v", err)
	}
	saveScreenshot(t, shot)
	queues := text(`#queues tbody`)
	for _, want := range []string{"mail", "report", "thumbnail", "paused"} {
		if !strings.Contains(queues, want) {
			t.Errorf("queues table lacks %q:\n%s", want, queues)
		}
	}
	running, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.querySelector('#queues tr[data-type="thumbnail"]').cells[4].textContent`)) // type, due, scheduled, waiting, running
	if err != nil || running != "1" {
		t.Errorf("thumbnail's running cell: %q %v, want 1", running, err)
	}
	// The running job's progress, in its status cell (running is the
	// list's first choice).
	if jobs := text(`#jobs tbody`); !strings.Contains(jobs, "running") || !strings.Contains(jobs, "40/120 (33%) page 40") {
		t.Errorf("the jobs table lacks the running job's progress:\n%s", jobs)
	}
	if failed := text(`#failed tbody`); !strings.Contains(failed, "550 mailbox unavailable") {
		t.Errorf("failed table lacks the last error:\n%s", failed)
	}
	if workers := text(`#workers-summary`); workers != "1 alive, 1 dead" {
		t.Errorf("workers: %q, want 1 alive, 1 dead", workers)
	}

	// Another window: the plots are drawn again, per hour.
	err = chromedp.Do(bctx,
		chromedp.SetValue(css(`#window`), "7d"),
		chromedp.Poll[chromedp.Void](`document.getElementById('window').dispatchEvent(new Event('change'))`),
		chromedp.Poll[chromedp.Void](`document.getElementById('series-note').textContent.indexOf('per hour') >= 0`, chromedp.WithPollingTimeout(time.Minute)),
		chromedp.Poll[chromedp.Void](plotted, chromedp.WithPollingTimeout(time.Minute)),
	)
	if err != nil {
		t.Fatalf("switching to 7 days: %v", err)
	}

	// Retry the failed job from the page, logged in.
	err = chromedp.Do(bctx,
		chromedp.SendKeys(css(`#user`), admin),
		chromedp.SendKeys(css(`#password`), password),
		chromedp.Click(css(`#login-button`)),
		chromedp.Poll[chromedp.Void](`document.body.dataset.user === `+jsString(admin), chromedp.WithPollingTimeout(30*time.Second)),
		chromedp.Click(css(`#failed button[data-action="api/jobs/`+failedID+`/retry"]`)),
		chromedp.Poll[chromedp.Void](`document.body.dataset.done === `+jsString("api/jobs/"+failedID+"/retry"), chromedp.WithPollingTimeout(time.Minute)),
	)
	if err != nil {
		t.Fatalf("retrying from the page: %v (status: %s)", err, text(`#status`))
	}
	it, err := q.Get(ctx, failedID)
	if err != nil || it.Status != protocol.StatusQueued || it.History[len(it.History)-1].By != admin {
		t.Fatalf("after the retry from the page: %+v %v; want queued, retried by %s", it, err, admin)
	}

	// The sites section appears once the database has sites: A beating,
	// B never yet.
	if hidden, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`document.getElementById('sites-section').hidden`)); err != nil || !hidden {
		t.Errorf("the sites section of a single database: hidden %v, %v", hidden, err)
	}
	opstest.SitesAB(ctx, t, db, nil)
	if err := chromedp.Do(bctx, chromedp.Poll[chromedp.Void](`!document.getElementById('sites-section').hidden &&
		document.querySelector('#sites tr[data-site="B"]') !== null`, chromedp.WithPollingTimeout(time.Minute))); err != nil {
		t.Fatalf("the sites section does not show: %v", err)
	}
	if summary := text(`#sites-summary`); summary != "2 sites, 1 without a recent heartbeat" {
		t.Errorf("sites summary: %q", summary)
	}
	sites := text(`#sites tbody`)
	for _, want := range []string{"A", "yes", "ago", "B", "never"} {
		if !strings.Contains(sites, want) {
			t.Errorf("sites table lacks %q:\n%s", want, sites)
		}
	}
}

// jsString quotes s for a JavaScript expression.
func jsString(s string) string { return fmt.Sprintf("%q", s) }

// saveScreenshot writes the PNG under the test's temp dir and, when
// $COUCHQ_SCREENSHOT is set, there too.
func saveScreenshot(t *testing.T, png []byte) {
	t.Helper()
	paths := []string{filepath.Join(t.TempDir(), "dashboard.png")}
	if p := os.Getenv(screenshotEnv); p != "" {
		paths = append(paths, p)
	}
	for _, p := range paths {
		if err := os.WriteFile(p, png, 0o644); err != nil {
			t.Fatalf("saving the screenshot: %v", err)
		}
		t.Logf("screenshot: %s", p)
	}
}

// simulateHour plays an hour of work before now on a clock of its own,
// so that the plots have something to show: every five minutes a few jobs
// of three types are enqueued, claimed after a wait, and finished, some
// failing for good and some with a retry.
func simulateHour(ctx context.Context, t *testing.T, db *kivik.DB, now time.Time) {
	t.Helper()
	clock := opstest.NewClock(now.Add(-55 * time.Minute))
	q, err := protocol.New(ctx, db, protocol.Config{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	types := []string{"mail", "report", "thumbnail"}
	for step := range 11 {
		for ti, typ := range types {
			base := now.Add(time.Duration(step*5-55)*time.Minute + time.Duration(ti)*10*time.Second)
			clock.Set(base)
			var jobs []*protocol.WorkItem
			for range 1 + (step+ti)%3 {
				it, err := q.Enqueue(ctx, protocol.NewJob{Worker: typ, MaxAttempts: 2, Payload: map[string]int{"step": step}})
				if err != nil {
					t.Fatal(err)
				}
				jobs = append(jobs, it)
			}
			clock.Set(base.Add(time.Duration(20+30*ti+10*(step%4)) * time.Second))
			for i, it := range jobs {
				if it, err = q.Claim(ctx, it, "sim/1/w", time.Hour); err != nil {
					t.Fatal(err)
				}
				clock.Set(clock.Now().Add(time.Duration(15+25*((step+i)%5)) * time.Second))
				switch {
				case (step+ti+i)%7 == 3:
					err = q.Fail(ctx, it, "upstream timeout", protocol.FailOptions{Final: true})
				case (step+ti+i)%5 == 1:
					err = q.Fail(ctx, it, "connection reset", protocol.FailOptions{RetryAfter: time.Minute})
				default:
					err = q.Complete(ctx, it, nil)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// seedEveryState leaves jobs in every state at now (queued, scheduled,
// running, failed, cancelled; the simulated hour left done ones), with a live
// and a dead worker and a paused type, and returns the id of a failed job.
func seedEveryState(ctx context.Context, t *testing.T, q *protocol.Client, now time.Time) string {
	t.Helper()
	enqueue := func(job protocol.NewJob) *protocol.WorkItem {
		it, err := q.Enqueue(ctx, job)
		if err != nil {
			t.Fatal(err)
		}
		return it
	}
	for range 3 {
		enqueue(protocol.NewJob{Worker: "mail"}) // queued, due now
	}
	enqueue(protocol.NewJob{Worker: "report", At: now.Add(time.Hour)}) // scheduled
	running, err := q.Claim(ctx, enqueue(protocol.NewJob{Worker: "thumbnail"}), "host-a/4242/w1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.ReportProgress(ctx, running, 40, 120, "page 40"); err != nil {
		t.Fatal(err)
	}
	failed := enqueue(protocol.NewJob{ID: "mail-bounce-1", Worker: "mail", MaxAttempts: 1})
	if failed, err = q.Claim(ctx, failed, "host-a/4242/w1", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := q.Fail(ctx, failed, "smtp: 550 mailbox unavailable", protocol.FailOptions{Final: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.CancelJob(ctx, enqueue(protocol.NewJob{Worker: "report"}).ID, "ops", "duplicate"); err != nil {
		t.Fatal(err)
	}
	if err := q.Pause(ctx, "report", "ops", "month-end freeze"); err != nil {
		t.Fatal(err)
	}
	t0 := protocol.ToUnix(now)
	for _, w := range []*protocol.WorkerInfo{
		{ID: protocol.WorkerDocID("host-a", 4242, "w1"), Claimant: "host-a/4242/w1", Host: "host-a", PID: 4242,
			Types: []string{"mail", "thumbnail"}, Concurrency: 2, Running: []string{running.ID},
			StartedAt: t0 - 3600, LastHeartbeat: t0, HeartbeatInterval: 10, BusySeconds: 3600 * 4 * 0.4, Completed: 40, Failed: 5},
		{ID: protocol.WorkerDocID("host-b", 77, "w1"), Claimant: "host-b/77/w1", Host: "host-b", PID: 77,
			Types: []string{"report"}, Concurrency: 1,
			StartedAt: t0 - 7200, LastHeartbeat: t0 - 600, HeartbeatInterval: 10, BusySeconds: 1200, Completed: 12},
	} {
		if err := q.PutWorker(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	return failed.ID
}
