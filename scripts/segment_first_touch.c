// The first-touch cost of a 64 MiB memfd segment (docs/performance.md, "Node-shared segments"):
// MAP_POPULATE (the core's order before 2026-12-05) against mmap + MADV_HUGEPAGE +
// MADV_POPULATE_WRITE (cpp/shm_segment.cpp now), then two write passes. Five rounds each.
//   gcc -O2 -o /tmp/ftouch scripts/segment_first_touch.c && /tmp/ftouch
// Compare under /sys/kernel/mm/transparent_hugepage/shmem_enabled = never and = advise.
#define _GNU_SOURCE
#include <sys/mman.h>
#include <unistd.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(void){
  const size_t n=64ul<<20;
  for(int rep=0;rep<5;rep++){
    for(int mode=0;mode<2;mode++){
      int fd=memfd_create("pop",0); if(ftruncate(fd,n)) return 1;
      double t0=now(); char*p;
      if(mode==0) p=mmap(0,n,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_POPULATE,fd,0);
      else { p=mmap(0,n,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0); madvise(p,n,MADV_HUGEPAGE);
             if(madvise(p,n,MADV_POPULATE_WRITE)) perror("populate"); }
      double t1=now(); memset(p,rep+1,n); double t2=now(); memset(p,rep+2,n); double t3=now();
      printf("%s: map+populate %.2f ms, first write %.2f ms, second write %.2f ms\n",
             mode?"advise+POPULATE_WRITE":"MAP_POPULATE", (t1-t0)*1e3,(t2-t1)*1e3,(t3-t2)*1e3);
      munmap(p,n); close(fd);
    }
  }
  return 0;
}
