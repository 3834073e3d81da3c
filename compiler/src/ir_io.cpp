#include "ir_io.hpp"

#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/Bitcode/BitcodeWriter.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/raw_ostream.h>

namespace spin::cc {

result<void> rewrite_bitcode(const std::string& in, const std::string& out, const char* what,
                             llvm::function_ref<result<void>(llvm::Module&)> edit) {
  auto buf = llvm::MemoryBuffer::getFile(in);
  if (!buf) return fail(errc::bad_state, "cannot read " + in + ": " + buf.getError().message());
  llvm::LLVMContext ctx;
  auto mod = llvm::parseBitcodeFile((*buf)->getMemBufferRef(), ctx);
  if (!mod) return fail(errc::bad_state, "cannot parse clang's IR: " + llvm::toString(mod.takeError()));
  llvm::Module& m = **mod;
  if (auto r = edit(m); !r) return r;
  std::string broken;
  llvm::raw_string_ostream bs(broken);
  if (llvm::verifyModule(m, &bs)) return fail(errc::bad_state, std::string("spinc broke the IR it ") + what + ": " + bs.str());
  std::error_code ec;
  llvm::raw_fd_ostream os(out, ec, llvm::sys::fs::OF_None);
  if (ec) return fail(errc::bad_state, "cannot write " + out + ": " + ec.message());
  llvm::WriteBitcodeToFile(m, os);
  os.close();
  if (os.has_error()) return fail(errc::bad_state, "cannot write " + out + ": " + os.error().message());
  return {};
}

} // namespace spin::cc
