package store

import (
	"os"
	"strconv"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
	corev1 "k8s.io/api/core/v1"
)

// rssFileKiB is this process's RssFile.
func rssFileKiB(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "RssFile:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no RssFile in /proc/self/status")
	return 0
}

// readAll reads every value of every bucket through bbolt's mapping.
func readAll(t *testing.T, s *Store) (n int) {
	t.Helper()
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(_ []byte, b *bolt.Bucket) error {
			return b.ForEach(func(_, v []byte) error {
				for _, c := range v {
					n += int(c) & 1
				}
				return nil
			})
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Unmap drops the pages of the store's file that reads mapped, and what
// is read afterwards is what was there.
func TestUnmapDropsTheMappedPages(t *testing.T) {
	s := openTemp(t)
	big := strings.Repeat("outpost ", 512) // 4 KiB a pod
	var pods []*corev1.Pod
	for i := range 1024 {
		p := pod("default", "p"+strconv.Itoa(i), "busybox")
		p.Annotations = map[string]string{"note": big}
		pods = append(pods, p)
	}
	if _, err := s.Pods().Replace(SourceAPI, pods); err != nil {
		t.Fatal(err)
	}
	want := readAll(t, s)
	before := rssFileKiB(t)
	if err := s.Unmap(); err != nil {
		t.Fatal(err)
	}
	after := rssFileKiB(t)
	t.Logf("RssFile %d → %d kB", before, after)
	if before-after < 3<<10 {
		t.Errorf("RssFile went from %d to %d kB, want it 3 MiB lower at least (4 MiB of pods were read)", before, after)
	}
	if got := readAll(t, s); got != want {
		t.Errorf("after Unmap the store reads differently: %d, want %d", got, want)
	}
	list, err := s.Pods().List()
	if err != nil || len(list) != 1024 || list[0].Object.Annotations["note"] != big {
		t.Fatalf("after Unmap: %d pods, %v", len(list), err)
	}

	// Read again, the pages are mapped again and dropped again.
	before = rssFileKiB(t)
	if err := s.Unmap(); err != nil {
		t.Fatal(err)
	}
	if after := rssFileKiB(t); before-after < 3<<10 {
		t.Errorf("a second Unmap after reading: RssFile went from %d to %d kB, want it 3 MiB lower at least", before, after)
	}
	// Nothing used since: Unmap begins no transaction of its own.
	used := s.txCount()
	if err := s.Unmap(); err != nil {
		t.Fatal(err)
	}
	if got := s.txCount(); got != used {
		t.Errorf("Unmap of a store unused since the last: %d transactions, then %d", used, got)
	}
	// A write maps pages too (bbolt reads the tree through the mapping).
	if err := s.Pods().Put(SourceAPI, pod("default", "after", "busybox")); err != nil {
		t.Fatal(err)
	}
	used = s.txCount()
	if err := s.Unmap(); err != nil {
		t.Fatal(err)
	}
	if got := s.txCount(); got == used {
		t.Error("Unmap after a write skipped the store")
	}
}
