package store

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/outpost-edge/outpost/internal/promtext"
)

// metricValues writes s's metrics and returns each sample's value by its
// name with labels, as written.
func metricValues(t *testing.T, s *Store) map[string]float64 {
	t.Helper()
	var b strings.Builder
	p := promtext.New(&b)
	s.WriteMetrics(p)
	if err := p.Flush(); err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for line := range strings.SplitSeq(strings.TrimSuffix(b.String(), "\n"), "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

func metricsPod(name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name)}}
}

func TestWriteMetrics(t *testing.T) {
	s := openTemp(t)
	page := float64(s.db.Info().PageSize)
	m := metricValues(t, s)
	if m["outpost_store_commits_total"] != 0 || m["outpost_store_written_bytes_total"] != 0 {
		t.Errorf("fresh store: commits %v, written %v; want 0 (Open's own transaction is not counted)", m["outpost_store_commits_total"], m["outpost_store_written_bytes_total"])
	}
	fi, err := os.Stat(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	if m["outpost_store_file_size_bytes"] != float64(fi.Size()) {
		t.Errorf("file size %v, want %d", m["outpost_store_file_size_bytes"], fi.Size())
	}

	if err := s.Pods().Put(SourceAPI, metricsPod("web")); err != nil {
		t.Fatal(err)
	}
	m = metricValues(t, s)
	written := m["outpost_store_written_bytes_total"]
	if m["outpost_store_commits_total"] != 1 {
		t.Errorf("commits after one put = %v, want 1", m["outpost_store_commits_total"])
	}
	// The changed pages and the meta page, each a whole page.
	if written < 2*page || written != page*float64(int(written/page)) {
		t.Errorf("one put wrote %v bytes; want whole %v-byte pages, at least 2", written, page)
	}
	if m[`outpost_store_objects{kind="pods"}`] != 1 || m[`outpost_store_objects{kind="services"}`] != 0 {
		t.Errorf("objects: %v", m)
	}

	// A put that changes nothing still commits, writing only the meta page.
	if err := s.Pods().Put(SourceAPI, metricsPod("web")); err != nil {
		t.Fatal(err)
	}
	m = metricValues(t, s)
	if m["outpost_store_commits_total"] != 2 || m["outpost_store_written_bytes_total"] != written+page {
		t.Errorf("no-op put: commits %v, written %v; want 2 and %v", m["outpost_store_commits_total"], m["outpost_store_written_bytes_total"], written+page)
	}

	// A failed write is rolled back: no commit.
	if err := s.Pods().Put(SourceStatic, metricsPod("web")); !errors.Is(err, ErrSourceConflict) {
		t.Fatalf("conflicting put: %v", err)
	}
	if got := metricValues(t, s)["outpost_store_commits_total"]; got != 2 {
		t.Errorf("commits after a failed put = %v, want 2", got)
	}

	// Concurrent puts share batched commits, each counted once.
	const n = 20
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if err := s.Pods().Put(SourceAPI, metricsPod("p"+strconv.Itoa(i))); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	m = metricValues(t, s)
	if c := m["outpost_store_commits_total"]; c < 3 || c > 2+n {
		t.Errorf("commits after %d concurrent puts = %v, want 3 to %d", n, c, 2+n)
	}
	if m[`outpost_store_objects{kind="pods"}`] != n+1 {
		t.Errorf("pods = %v, want %d", m[`outpost_store_objects{kind="pods"}`], n+1)
	}
	t.Logf("%v commits for %d puts, %v bytes", m["outpost_store_commits_total"]-2, n, m["outpost_store_written_bytes_total"])
}
